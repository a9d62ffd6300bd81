"""The two example products that mirror real stacks, built and released end to end, then checked as a
downloader would: ``build.py verify --load`` and ``scripts/verify-release.sh``, each into an engine that
never saw the image.

* ``examples/sglang-arm64-roce``: an SGLang fork on four nodes over RoCE (env file of 56 keys, a folder
  overlay of 87 files with an md5 ledger, a patch, a Makefile-built and a prebuilt tarball kernel, a
  multi-node profile with a sidecar);
* ``examples/hygon-dcu-tp``: TP1/TP2/TP4 on Hygon DCUs (seven .so from a Makefile, commands and cc, a
  prebuilt wheel, a legacy flash-attn and an upper-case sidecar only TP2 loads, per-profile env files).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from unibake.scratch import ScratchEngine

from ..conftest import REPO
from ..unit.test_real_stacks import _fake_getent  # the host's groups, as run.sh looks them up
from .test_downloader import run_guide

pytestmark = pytest.mark.slow

EXAMPLES = {
    "sglang-arm64-roce": {"product": "sglang-roce", "profiles": ["tp16", "tp4"]},
    "hygon-dcu-tp": {"product": "hygon-dcu-tp", "profiles": ["tp1", "tp2", "tp4"]},
}


def sh(cmd: list[str], cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_example_is_built_released_and_verified_as_a_downloader_would(cli, engine, images, version, tmp_path,
                                                                          example):
    spec = EXAMPLES[example]
    tag = f"{spec['product']}:{version}"
    images(tag)
    out = tmp_path / "release"
    started = time.monotonic()
    result = cli("--config", str(REPO / "examples" / example / "profiles"), "--version", version, "--out", str(out))
    assert result.code == 0, result.err
    print(f"\n{example}: released in {time.monotonic() - started:.1f} s")
    folder = out / version

    validation = json.loads((folder / "VALIDATION.json").read_text())
    assert validation["passed"] and validation["round_trip"]["image_id"] == engine.inspect_image(tag).id
    assert sorted(g["profile"] for g in validation["smoke"]) == sorted(spec["profiles"])
    for gate in validation["smoke"]:
        assert gate["restart_count"] == 0 and gate["oom_killed"] is False
        assert gate["chats"] and all(c["passed"] for c in gate["chats"])
        assert gate["steps"][-1] == {**gate["steps"][-1], "name": "stability", "passed": True}

    manifest = json.loads((folder / "manifest.json").read_text())
    notes = (folder / "RELEASE_NOTES.md").read_text()
    sums = (folder / "SHA256SUMS").read_text()
    for attachment in manifest["attachments"]:
        assert f"  {attachment['name']}\n" in sums and f"]({attachment['name']})" in notes
    assert manifest["external"] and all(e["name"] in notes for e in manifest["external"])
    assert "## What changed" in notes and "## Known limits" in notes

    # The downloader's checks: verify --load and the plain-shell script, each into an engine without the image
    # (a scratch engine started after the release: the release's own round trip stops any it finds).
    with ScratchEngine() as scratch:
        loaded = cli("verify", str(folder), "--load", "--engine", scratch.engine.address)
        assert loaded.code == 0, loaded.err
        assert f"loaded as {manifest['image_id']}" in loaded.err
        scratch.engine.remove_image(tag)
        script = sh([str(REPO / "scripts/verify-release.sh"), str(folder)], folder, DOCKER_HOST=scratch.engine.address)
        assert script.returncode == 0, script.stderr
        assert f"ok: {tag} is {manifest['image_id']}, as IMAGE_ID says" in script.stdout
        # every command of the release's own guide, multi-node dry runs and the in-image self-check included
        # (run.sh looks the profile's groups up on the host: this one has video, not render)
        fake_bin = _fake_getent(tmp_path, {"video": 44, "render": 109})
        lines, printed = run_guide((folder / "README-DIST.md").read_text(), folder, scratch.engine.address, skip=(),
                                   variables={"PATH": f"{fake_bin}:$PATH"})
        assert "image ID ok\n" in printed, printed
        assert any(line.startswith("NODE_RANK=0 MASTER_ADDR=") for line in lines) == (example == "sglang-arm64-roce")

    # What the stack itself needs, in the image.
    profile = spec["profiles"][0]
    check = engine.run(tag, ["self-check"], env={"PROFILE": profile})
    assert check.exit_code == 0, check.output
    if example == "sglang-arm64-roce":
        assert "87 files match meta/overlays.md5" in check.output
        assert manifest["profiles"]["tp16"]["topology"]["nodes"] == 4
        assert len(manifest["profiles"]["tp4"]["env"]) == 56 and len(manifest["profiles"]["tp16"]["env"]) == 57
        assert "56 keys" in notes and "moe_fp8-adapter" in notes
        dry = sh(["./run.sh", "--dry-run", "tp16"], folder, NODE_RANK="2", MASTER_ADDR="node0.example")
        assert dry.returncode == 0, dry.stderr
        assert ("-e NNODES=4 -e NODE_RANK=2 -e MASTER_ADDR=node0.example -e MASTER_PORT=20000 --network host "
                "--ipc=host --device /dev/infiniband --ulimit memlock=-1:-1") in dry.stdout
        missing = sh(["./run.sh", "--dry-run", "tp16"], folder)
        assert missing.returncode == 2 and "set NODE_RANK (0 to 3) and MASTER_ADDR" in missing.stderr
    else:
        libraries = engine.run(tag, ["sh", "-c", "ls /opt/unibake/kernels/*/*.so | wc -l"]).output.strip()
        assert libraries == "7"  # the seven built by the vendor's compiler; lmslim's wheel keeps its own folder
        assert "tp2_row_LDSx" in json.dumps(manifest["profiles"]["tp2"]["sidecars"])
        dry = sh(["./run.sh", "tp2", "--dry-run"], folder, GPUS="4,5", PATH=f"{fake_bin}:{os.environ['PATH']}")
        assert dry.returncode == 0, dry.stderr
        assert ("--device /dev/kfd --security-opt seccomp=unconfined --device /dev/dri/renderD132 "
                "--device /dev/dri/renderD133 -e HIP_VISIBLE_DEVICES=0,1 --device /dev/mkfd --group-add 44 "
                "--group-add 109" in dry.stdout)
