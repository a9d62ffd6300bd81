"""The downloader's side, played end to end on a busybox-sized release split into parts."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from unibake.scratch import ScratchEngine

from ..conftest import REPO


@pytest.fixture
def scratch():
    """An engine that has never seen the image, for the downloader's load."""
    with ScratchEngine() as engine:
        yield engine


def make_release(cli, product: Path, version: str, out: Path, split: bool) -> Path:
    """A busybox-sized release of the test product, in one file or in 1 MiB parts."""
    extra = ["--split", "1MiB"] if split else []
    assert cli("--config", str(product), "--version", version, "--out", str(out), "--no-roundtrip", *extra).code == 0
    return out / version


@pytest.fixture
def split_release(cli, busybox_product, version, images, tmp_path) -> Path:
    images(f"unibake-test:{version}")
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text() + "devices: {vendor: amd}\n")
    return make_release(cli, busybox_product, version, tmp_path / "release", split=True)


def sh(cmd: list[str] | str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, shell=isinstance(cmd, str),
                          env={**os.environ, **env})


def code_lines(markdown: str, skip: tuple[str, ...]) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", markdown, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")
            and not any(marker in line for marker in skip)]


def test_the_downloader_end_to_end(cli, split_release, version, scratch):
    folder = split_release
    parts = sorted(p.name for p in folder.iterdir() if ".part-" in p.name)
    assert parts == [f"unibake-test-{version}.tar.zst.part-000", f"unibake-test-{version}.tar.zst.part-001"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [f["name"] for f in manifest["archive"]["files"]] == parts
    sums = (folder / "SHA256SUMS").read_text()
    assert all(f"  {p}\n" in sums for p in parts)
    notes = (folder / "RELEASE_NOTES.md").read_text()
    # each part named, in order: a glob would also take a file the sums do not list
    assert f"cat {' '.join(parts)} | zstd -dc | docker load" in notes
    assert manifest["archive"]["sha256"] in notes  # the whole stream's sha256 too

    # One part corrupted: sha256sum -c and verify both fail, naming it; repaired, both pass.
    first = folder / parts[0]
    good = first.read_bytes()
    first.write_bytes(good[:1000] + bytes([good[1000] ^ 0x40]) + good[1001:])
    bad = sh(["sha256sum", "-c", "SHA256SUMS"], folder)
    assert bad.returncode != 0 and f"{parts[0]}: FAILED" in bad.stdout
    verify = cli("verify", str(folder))
    assert verify.code == 3 and verify.error_lines[-1].startswith(f"error: {parts[0]}: sha256 check failed")
    assert "FAILS" in cli("releases", "--out", str(folder.parent)).err
    first.write_bytes(good)
    assert sh(["sha256sum", "-c", "SHA256SUMS"], folder).returncode == 0
    assert cli("verify", str(folder)).code == 0
    assert "verifies" in cli("releases", "--out", str(folder.parent)).err

    # A missing part and a truncated one are named as such.
    second = folder / parts[1]
    kept = second.read_bytes()
    second.unlink()
    missing = cli("verify", str(folder))
    assert missing.code == 3 and f"{parts[1]}: " in missing.error_lines[-1] and "missing" in missing.err
    second.write_bytes(kept[: len(kept) // 2])
    truncated = cli("verify", str(folder))
    assert truncated.code == 3 and f"truncated: {len(kept) // 2} of {len(kept)} bytes" in truncated.err
    second.write_bytes(kept)

    # The plain-shell check loads into an engine that never saw the image and confirms the ID.
    script = sh([str(REPO / "scripts/verify-release.sh"), str(folder)], folder, DOCKER_HOST=scratch.engine.address)
    assert script.returncode == 0, script.stderr
    assert f"ok: unibake-test:{version} is {manifest['image_id']}, as IMAGE_ID says" in script.stdout
    assert scratch.engine.inspect_image(manifest["image_id"]) is not None

    # run.sh gives each profile its GPUs, in its vendor's style.
    assert "--gpus '\"device=0\"'" in sh(["./run.sh", "--dry-run", "tp1"], folder).stdout
    amd = sh(["./run.sh", "--dry-run", "tp2"], folder, GPUS="6,7").stdout
    assert "--device /dev/kfd" in amd and "--device /dev/dri/renderD134 --device /dev/dri/renderD135" in amd
    assert "--gpus" not in amd


def test_verify_load_compares_the_image_id_in_a_fresh_engine(cli, split_release, scratch):
    result = cli("verify", str(split_release), "--load", "--engine", scratch.engine.address)
    assert result.code == 0, result.err
    image_id = (split_release / "IMAGE_ID").read_text().strip()
    assert f"loaded as {image_id}" in result.err


def test_verify_release_script_refuses_a_corrupt_part_before_loading(split_release, scratch):
    part = sorted(split_release.glob("*.part-001"))[0]
    part.write_bytes(part.read_bytes()[:-10])
    script = sh([str(REPO / "scripts/verify-release.sh"), str(split_release)], split_release,
                DOCKER_HOST=scratch.engine.address)
    assert script.returncode == 3
    assert "error: " in script.stderr and "differ from SHA256SUMS" in script.stderr
    assert scratch.engine.inspect_image((split_release / "IMAGE_ID").read_text().strip()) is None


def run_guide(markdown: str, folder: Path, engine_address: str, *, skip: tuple[str, ...],
              variables: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Run every command of a guide's code blocks in ``folder``, in order, as one script; the lines run, and
    what the script printed (a check written ``test ... && echo ok`` does not stop a ``set -e`` script when it
    fails: what it printed says whether it passed)."""
    # the registry's and the many engines' lines run in tests/engine/test_registry.py and test_deploy.py
    lines = code_lines(markdown, skip + ("# needs GPUs", "# from a registry", "# several engines"))
    script = "set -e\n" + "".join(f"{k}={v}\n" for k, v in (variables or {}).items())
    script += "".join(line + "\n" for line in lines if not re.match(r"^[A-Z]+=\S+\s+#", line))
    result = sh(["sh", "-c", script], folder, DOCKER_HOST=engine_address)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return lines, result.stdout


@pytest.mark.parametrize("split", [False, True], ids=["single-file", "parts"])
def test_every_command_of_the_release_guide_works(cli, busybox_product, version, images, tmp_path, scratch, split):
    images(f"unibake-test:{version}")
    folder = make_release(cli, busybox_product, version, tmp_path / "release", split)
    lines, printed = run_guide((folder / "README-DIST.md").read_text(), folder, scratch.engine.address, skip=())
    assert any("zstd -dc | docker load" in line or "| docker load" in line for line in lines)
    assert any(".part-000 " in line for line in lines) == split and not any(".part-*" in line for line in lines)
    assert "image ID ok\n" in printed, printed  # (printed: the check ran and passed)
    assert sum(1 for line in lines if line.startswith("./run.sh --dry-run")) == 2


@pytest.mark.parametrize("split", [False, True], ids=["single-file", "parts"])
def test_every_command_of_the_top_level_guide_works(cli, busybox_product, version, images, tmp_path, scratch, split):
    images(f"unibake-test:{version}")
    folder = make_release(cli, busybox_product, version, tmp_path / "release", split)
    guide = (REPO / "README-DIST.md").read_text()
    skip = ("# single file only",) if split else ("# parts only",)
    # the guide's signature lines are for the kinds the publisher signs with, and fail where there is
    # none (test_signatures_hardened runs them): this release is unsigned
    skip += ("# signed with",)
    variables = {"ARCHIVE": f"unibake-test-{version}.tar.zst", "TAG": f"unibake-test:{version}"}
    lines, printed = run_guide(guide, folder, scratch.engine.address, skip=skip, variables=variables)
    assert any("docker load" in line for line in lines) and any("self-check" in line for line in lines)
    assert "image ID ok\n" in printed, printed
