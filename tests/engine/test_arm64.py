"""arm64 on this amd64 machine, under emulation (qemu-user with binfmt_misc, as scripts/setup.sh
registers it): the busybox product and the example product released for linux/arm64, and both
platforms released at once, or neither."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

OCI_ARM64 = {"architecture": "arm64", "os": "linux", "variant": "v8"}


def with_arm64_base(profiles: Path, base: str = "localhost/unibake-busybox:1-arm64") -> Path:
    product = profiles / "product.yaml"
    product.write_text(product.read_text().replace(
        'base: {image: "localhost/unibake-busybox:1"}',
        f'base: {{image: "localhost/unibake-busybox:1", platforms: {{linux/arm64: "{base}"}}}}'))
    return profiles


def archive_index(archive: Path) -> dict:
    with open(archive, "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return json.loads(tar.extractfile("index.json").read())


def assert_arm64_release(cli, engine, folder: Path, tag: str, archive: str, profiles: list[str]) -> dict:
    """The image config, manifest, notes and the archive's OCI index all say linux/arm64; the gates
    passed on the scratch engine under emulation; the folder verifies."""
    info = engine.inspect_image(tag)
    assert (info.architecture, info.variant, info.os) == ("arm64", "v8", "linux")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["platform"] == "linux/arm64" and manifest["image_id"] == info.id
    assert "| Platform | `linux/arm64` |" in (folder / "RELEASE_NOTES.md").read_text()
    assert archive_index(folder / archive)["manifests"][0]["platform"] == OCI_ARM64
    validation = json.loads((folder / "VALIDATION.json").read_text())
    assert validation["round_trip"]["image_id"] == info.id
    assert [(g["profile"], g["passed"]) for g in validation["smoke"]] == [(p, True) for p in profiles]
    verified = cli("verify", str(folder))
    assert verified.code == 0, verified.err
    return manifest


def test_an_arm64_release_carries_its_platform_and_passes_its_gates_under_emulation(cli, engine, busybox_product,
                                                                                   version, images, tmp_path):
    tag = f"unibake-test:{version}-arm64"
    images(tag)
    out = tmp_path / "release"
    result = cli("--config", str(with_arm64_base(busybox_product)), "--version", version, "--out", str(out),
                 "--platform", "linux/arm64")
    assert result.code == 0, result.err
    folder = out / f"{version}-arm64"
    assert_arm64_release(cli, engine, folder, tag, f"unibake-test-{version}-arm64.tar.zst", ["tp1", "tp2"])
    run = engine.run(tag, ["self-check"], env={"PROFILE": "tp2"})  # the engine itself, under emulation
    assert run.exit_code == 0 and "ok: platform linux/arm64 (uname -m: aarch64)" in run.output, run.output


def test_an_arm64_hotfix_is_assembled_under_emulation_and_is_the_image_a_whole_build_gives(cli, engine, busybox_product,
                                                                                            version, images, tmp_path):
    # (the small build's RUN steps run under emulation like the whole build's; the assembled config must
    # record linux/arm64/v8 as the whole build's does, or the image ID differs)
    base, fix = version, f"{version}h"
    for v in (base, fix):
        images(f"unibake-test:{v}-arm64")
    out = tmp_path / "release"
    profiles = with_arm64_base(busybox_product)
    common = ("--config", str(profiles), "--out", str(out), "--no-smoke")
    made = cli("--version", base, "--platform", "linux/arm64", *common)
    assert made.code == 0, made.err
    tune = busybox_product.parent / "images/tune/tp1/cache-1.json"
    tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
    assert cli("lock", "--config", str(profiles)).code == 0
    made = cli("hotfix", "--from", f"{base}-arm64", "--version", fix, *common)
    assert made.code == 0, made.err
    assert "assembled: the steps below the build memo's marker built alone" in made.err, made.err
    folder = out / f"{fix}-arm64"
    manifest = assert_arm64_release(cli, engine, folder, f"unibake-test:{fix}-arm64",
                                    f"unibake-test-{fix}-arm64.tar.zst", [])
    whole = cli("hotfix", "--from", f"{base}-arm64", "--version", fix, "--full-build", "--force", *common)
    assert whole.code == 0, whole.err
    assert "(not assembled): --full-build" in whole.err
    assert json.loads((folder / "manifest.json").read_text())["image_id"] == manifest["image_id"]


def without_variant(engine, source: str, tag: str) -> str:
    """``source`` loaded again as ``tag`` with a config that records no CPU variant (``arm64``, as many
    published arm64 images do), its layers unchanged."""
    members = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(engine.save(source)))) as tar:
        for m in tar.getmembers():
            members[m.name] = (m, tar.extractfile(m).read() if m.isfile() else None)
    manifest = json.loads(members["manifest.json"][1])
    config = json.loads(members[manifest[0]["Config"]][1])
    config.pop("variant", None)
    raw = json.dumps(config).encode()
    name = f"{hashlib.sha256(raw).hexdigest()}.json"
    del members[manifest[0]["Config"]]
    manifest[0].update(Config=name, RepoTags=[tag])
    members.pop("repositories", None)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for m, data in members.values():
            if m.name == "manifest.json":
                data = json.dumps(manifest).encode()
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
        info = tarfile.TarInfo(name)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    engine.load([out.getvalue()])
    return tag


def test_the_kit_of_an_arm64_release_rebuilds_to_its_image_id_on_this_amd64_machine(cli, engine, busybox_product,
                                                                                  version, images, tmp_path):
    # the base records no variant: the build stage records linux/arm64/v8 in the config, and so must
    # the kit's rebuild (the kit names the platform), or it rebuilds another image ID
    base = f"unibake-test-base:{version}-novariant"
    images(base)
    without_variant(engine, "localhost/unibake-busybox:1-arm64", base)
    assert engine.inspect_image(base).variant in (None, "")
    tag = f"unibake-test:{version}-arm64"
    images(tag)
    images(f"unibake-kit/unibake-test:{version}-arm64")
    out = tmp_path / "release"
    result = cli("--config", str(with_arm64_base(busybox_product, base=base)), "--version", version, "--out",
                 str(out), "--platform", "linux/arm64", "--no-smoke")
    assert result.code == 0, result.err
    folder = out / f"{version}-arm64"
    released = engine.inspect_image(tag)
    assert (released.architecture, released.variant) == ("arm64", "v8")
    kit_folder = tmp_path / "kit"
    kit_folder.mkdir()
    with open(folder / f"unibake-test-{version}-arm64-kit.tar.zst", "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(kit_folder, filter="tar")
    (unpacked,) = kit_folder.iterdir()
    assert json.loads((unpacked / "kit.json").read_text())["platform"] == "linux/arm64"
    rebuilt = cli("rebuild", str(unpacked))
    assert rebuilt.code == 0, rebuilt.err
    assert engine.inspect_image(f"unibake-kit/unibake-test:{version}-arm64").id == released.id


def test_both_platforms_are_released_at_once_as_two_folders(cli, engine, busybox_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    images(f"unibake-test:{version}-arm64")
    out = tmp_path / "release"
    result = cli("--json", "--config", str(with_arm64_base(busybox_product)), "--version", version, "--out", str(out),
                 "--platform", "linux/amd64", "--platform", "linux/arm64")
    assert result.code == 0, result.err
    releases = json.loads(result.out)["releases"]
    assert [(r["release"], r["platform"]) for r in releases] == [(version, "linux/amd64"),
                                                                 (f"{version}-arm64", "linux/arm64")]
    assert sorted(p for p in os.listdir(out) if not p.startswith(".")) == [version, f"{version}-arm64"]
    assert_arm64_release(cli, engine, out / f"{version}-arm64", f"unibake-test:{version}-arm64",
                         f"unibake-test-{version}-arm64.tar.zst", ["tp1", "tp2"])
    amd64 = engine.inspect_image(f"unibake-test:{version}")
    assert amd64.architecture == "amd64" and releases[0]["image_id"] == amd64.id != releases[1]["image_id"]
    assert archive_index(out / version / f"unibake-test-{version}.tar.zst")["manifests"][0]["platform"] == \
        {"architecture": "amd64", "os": "linux"}
    assert cli("verify", str(out / version)).code == 0


def test_a_failure_on_one_platform_publishes_neither(cli, engine, busybox_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    profiles = with_arm64_base(busybox_product, base="localhost/unibake-busybox:1")  # an amd64 image as the arm64 base
    result = cli("--config", str(profiles), "--version", version, "--out", str(out), "--no-roundtrip",
                 "--platform", "linux/amd64,linux/arm64")
    assert result.code == 2
    assert result.error_lines == ["error: the base image localhost/unibake-busybox:1 is linux/amd64, not linux/arm64: "
                                  "set base.platforms.linux/arm64 in product.yaml to a linux/arm64 image "
                                  "(scripts/setup.sh makes the example's)"]
    assert "==> platform linux/arm64 (2 of 2): plan" in result.err  # both planned and checked before any build
    assert "==> build" not in result.err
    assert [p for p in os.listdir(out) if not p.endswith(".lock")] == []
    assert engine.inspect_image(f"unibake-test:{version}-arm64") is None
    assert engine.inspect_image(f"unibake-test:{version}") is None  # amd64 was not built for nothing


@pytest.mark.slow
def test_the_example_product_is_released_for_arm64_and_checks_itself_under_emulation(cli, engine, demo_product,
                                                                                    version, images, tmp_path):
    tag = f"demo-llm:{version}-arm64"
    images(tag)
    out = tmp_path / "release"
    started = time.monotonic()
    result = cli("--config", str(demo_product), "--version", version, "--out", str(out), "--platform", "linux/arm64")
    assert result.code == 0, result.err
    print(f"\narm64 demo release in {time.monotonic() - started:.1f} s")
    folder = out / f"{version}-arm64"
    assert_arm64_release(cli, engine, folder, tag, f"demo-llm-{version}-arm64.tar.zst", ["tp1", "tp2", "tp4"])
    for profile in ("tp1", "tp2", "tp4"):
        run = engine.run(tag, ["self-check"], env={"PROFILE": profile})
        assert run.exit_code == 0, run.output
        assert "ok: platform linux/arm64 (uname -m: aarch64)" in run.output
        assert "kernels load" in run.output  # kernels compiled for arm64, loaded by arm64 Python
    elf = engine.run(tag, ["python3", "-c", "import struct,sys; d=open(sys.argv[1],'rb').read(20); "
                                            "print(struct.unpack('<H', d[18:20])[0])",
                           "/opt/unibake/kernels/rmsnorm/librmsnorm.so"])
    assert elf.output.strip() == "183"  # e_machine EM_AARCH64


def test_the_emulation_check_runs_the_base_s_shell_not_its_entrypoint(engine, images, version):
    """A foreign base is run once before a multi-platform build (targets.check_emulation): its own
    ENTRYPOINT (an inference server's) ran with '/bin/sh -c true' as arguments, until the 60 s timeout."""
    from types import SimpleNamespace

    from unibake.platforms import KNOWN
    from unibake.targets import check_emulation

    from .conftest import build_dockerfile

    tag = f"unibake-test-entrypoint:{version}-arm64"
    images(tag)
    server = b'ENTRYPOINT ["/bin/sh", "-c", "exec sleep 3600"]\n'  # a server's: its arguments ignored
    build_dockerfile(engine, tag, b"FROM localhost/unibake-busybox:1-arm64\n" + server)
    assert engine.inspect_image(tag).architecture == "arm64"
    started = time.monotonic()
    check_emulation(engine, SimpleNamespace(platform=KNOWN["linux/arm64"], base_image=tag))
    assert time.monotonic() - started < 30
