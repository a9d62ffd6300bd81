"""verify-release.sh's load: an archive changed after it was checked never reaches the engine, and
a load that fails is undone, leaving the engine as it was (busybox-sized images, a scratch engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from unibake.scratch import ScratchEngine

from ..conftest import REPO
from ..forge import also_tagging_the_victim, forge
from ..savefixtures import docker_layout, layer_tar
from ..unit.test_publish import make_release

SCRIPT = REPO / "scripts" / "verify-release.sh"


@pytest.fixture(params=["coreutils", "busybox"])
def tools(request, tmp_path) -> str:
    """What runs the script's head, tail, tee, cmp and tar: the system's, or busybox's."""
    bin_dir = tmp_path / "tools-bin"
    bin_dir.mkdir()
    if request.param == "busybox":
        busybox = shutil.which("busybox")
        if busybox is None:
            pytest.skip("no busybox here")
        for tool in ("head", "tail", "tee", "cmp", "tar"):
            (bin_dir / tool).write_text(f'#!/bin/sh\nexec {busybox} {tool} "$@"\n')
            (bin_dir / tool).chmod(0o755)
    return str(bin_dir)


@pytest.fixture
def scratch():
    with ScratchEngine() as engine:
        yield engine


def docker(address: str, *args: str, data: bytes | None = None) -> str:
    result = subprocess.run(["docker", *args], input=data, capture_output=True, env={**os.environ, "DOCKER_HOST": address})
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def engine_images(address: str) -> list[str]:
    return sorted(docker(address, "image", "ls", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}")
                  .splitlines())


def held_before(address: str) -> tuple[str, str]:
    """An engine holding victim:1, and an image without a tag: (victim's ID, the untagged one's)."""
    docker(address, "load", data=docker_layout([layer_tar({"v": b"victim\n"})], tag="victim:1")[0])
    held, held_id, _ = docker_layout([layer_tar({"h": b"held untagged\n"})], tag="held:1")
    docker(address, "load", data=held)
    docker(address, "tag", "victim:1", "held:1")  # held:1 moved away: its image stays, untagged
    docker(address, "rmi", "held:1")
    victim_id = docker(address, "image", "inspect", "--format", "{{.Id}}", "victim:1").strip()
    assert f"{held_id} <none>:<none>" in engine_images(address)
    return victim_id, held_id


def with_docker(tmp_path: Path, address: str, script: str, tools: str = "") -> dict:
    """The environment of a verify-release.sh whose docker runs SCRIPT first (with $real, the real
    docker): an attacker's moment, or an engine that loads other bytes than it is fed."""
    bin_dir = tmp_path / "docker-bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\nreal={shutil.which('docker')}\n{script}\nexec $real \"$@\"\n")
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "DOCKER_HOST": address, "PATH": f"{tools + ':' if tools else ''}{bin_dir}:{os.environ['PATH']}"}


def test_an_archive_swapped_after_its_checks_never_reaches_the_engine(tmp_path, scratch, tools):
    address = scratch.engine.address
    folder = make_release(tmp_path / "release")[0]
    forged = make_release(tmp_path / "other", layers=[layer_tar({"opt/app/x": b"not the release\n"})])[0]
    forge(forged, also_tagging_the_victim)  # another image, tagged as the release and as victim:1
    held_before(address)
    before = engine_images(address)
    # swapped once every check has passed, just before the load
    swap = (f'if [ "$1" = image ] && [ ! -e {tmp_path}/swapped ]; then : > {tmp_path}/swapped; '
            f"cp {forged}/demo-llm-1.3.1.tar.zst {folder}/; fi")
    result = subprocess.run(["sh", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=300,
                            env=with_docker(tmp_path, address, swap, tools))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and len(errors) == 1, result.stdout + result.stderr
    # the engine was given a cut tar, which it refuses before it adds anything
    assert "the archive changed after sha256sum -c read it" in errors[0] and "docker load refused it" in errors[0]
    # (before: the engine's victim:1 and demo-llm:1.3.1 named the forged image)
    assert engine_images(address) == before


def test_a_load_that_brings_another_image_is_undone_and_what_the_engine_held_stays(tmp_path, scratch):
    address = scratch.engine.address
    folder = make_release(tmp_path / "release")[0]
    victim_id, held_id = held_before(address)
    before = engine_images(address)
    # an engine that loads other bytes than it is fed: another image tagged as the release and as
    # victim:1, and the image it held untagged, now tagged rogue:1
    rogue = tmp_path / "rogue"
    rogue.mkdir()
    other, other_id, _ = docker_layout([layer_tar({"o": b"other\n"})], tag="demo-llm:1.3.1")
    (rogue / "1.tar").write_bytes(other)
    (rogue / "2.tar").write_bytes(docker_layout([layer_tar({"h": b"held untagged\n"})], tag="rogue:1")[0])
    load = (f'if [ "$1" = load ]; then cat > /dev/null; $real load < {rogue}/1.tar && $real tag demo-llm:1.3.1 '
            f'victim:1 && echo "Loaded image: victim:1" && $real load < {rogue}/2.tar; exit; fi')
    result = subprocess.run(["sh", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=300,
                            env=with_docker(tmp_path, address, load))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and len(errors) == 1, result.stdout + result.stderr
    assert f"the loaded image demo-llm:1.3.1 is {other_id}" in errors[0]
    assert "; what the load added was removed" in errors[0]
    # (before: demo-llm:1.3.1, victim:1 and rogue:1 stayed as the load left them)
    assert engine_images(address) == before
    assert "warning" not in result.stderr


def test_a_failed_load_s_undo_leaves_an_image_another_client_added_meanwhile(tmp_path, scratch):
    # another client's image left without a tag while the load ran, then a load the engine refuses
    # (before: the undo removed every image without a tag that had appeared during the load, this one too)
    address = scratch.engine.address
    folder = make_release(tmp_path / "release")[0]
    held_before(address)
    intruder, intruder_id, _ = docker_layout([layer_tar({"i": b"another client's\n"})], tag="intruder:1")
    (tmp_path / "intruder.tar").write_bytes(intruder)
    before = engine_images(address)
    load = (f'if [ "$1" = load ]; then $real load < {tmp_path}/intruder.tar > /dev/null && $real tag victim:1 intruder:1 '
            f'&& $real rmi intruder:1 > /dev/null; head -c 4096 > {tmp_path}/cut; cat > /dev/null; '
            f'exec $real load < {tmp_path}/cut; fi')
    result = subprocess.run(["sh", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=300,
                            env=with_docker(tmp_path, address, load))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and len(errors) == 1, result.stdout + result.stderr
    assert "docker load refused the archive" in errors[0] and "warning" not in result.stderr
    assert engine_images(address) == sorted(before + [f"{intruder_id} <none>:<none>"])


def test_verify_load_never_loads_an_archive_swapped_after_its_checks(tmp_path, scratch):
    # build.py verify --load: the same swap between the check's read and the load's
    from unibake.verify import load_and_compare, verify_folder

    address = scratch.engine.address
    folder = make_release(tmp_path / "release")[0]
    forged = make_release(tmp_path / "other", layers=[layer_tar({"opt/app/x": b"not the release\n"})])[0]
    forge(forged, also_tagging_the_victim)
    held_before(address)
    before = engine_images(address)
    report = verify_folder(folder)
    assert not report.failures
    shutil.copy(forged / "demo-llm-1.3.1.tar.zst", folder / "demo-llm-1.3.1.tar.zst")
    report = load_and_compare(report, scratch.engine)
    assert [c.name for c in report.failures] == ["load"]
    assert "changed after it was checked" in report.failures[0].detail and "nothing was loaded" in report.failures[0].detail
    assert engine_images(address) == before
