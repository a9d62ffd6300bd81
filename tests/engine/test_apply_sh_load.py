"""A hotfix's apply.sh in a real engine: a tampered, cut or swapped archive leaves the engine as it
was, and a load that brings another image is undone (busybox-sized images, a scratch engine)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ..forge import cut_archive, forge, resum
from ..savefixtures import docker_layout, layer_tar
from ..unit.test_apply_sh import also_tagging_the_victim
from ..unit.test_hotfix import hotfix_pair
from .test_shell_verify_load import engine_images, held_before, scratch, with_docker  # noqa: F401 - a fixture


@pytest.fixture
def based(tmp_path, scratch):  # noqa: F811
    """(the hotfix folder, the scratch engine's address): the engine holds its base release, victim:1
    and an image without a tag."""
    address = scratch.engine.address
    base, folder, _ = hotfix_pair(tmp_path / "release")
    subprocess.run(f"zstd -dc {base}/demo-llm-1.0.tar.zst | docker load", shell=True, check=True, capture_output=True,
                   env=docker_env(tmp_path, address, name="base"))
    held_before(address)
    return folder, address


def docker_env(tmp_path, address: str, script: str = "", name: str = "plain") -> dict:
    (tmp_path / name).mkdir()
    return with_docker(tmp_path / name, address, script)


def apply(folder, env) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run(["sh", "./apply.sh"], cwd=folder, capture_output=True, text=True, timeout=300, env=env)
    return result, [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("how, says", [
    ("tampered", "a load would do more than the release says"),
    ("cut", "the archive does not decompress (corrupted or truncated)"),
])
def test_a_tampered_or_cut_hotfix_archive_leaves_the_engine_as_it_was(tmp_path, based, how, says):
    # every sum rewritten to agree (before: the tampered archive was loaded: victim:1 then named its image)
    folder, address = based
    if how == "tampered":
        forge(folder, also_tagging_the_victim)
    else:
        cut_archive(folder, "demo-llm-1.1.tar.zst", 40)  # its sums and manifest.json's record made to agree
    before = engine_images(address)
    result, errors = apply(folder, docker_env(tmp_path, address))
    assert result.returncode == 3 and len(errors) == 1 and says in errors[0], result.stdout + result.stderr
    assert engine_images(address) == before


def test_a_hotfix_archive_swapped_after_its_checks_never_reaches_the_engine(tmp_path, based):
    folder, address = based
    forged = tmp_path / "forged"
    shutil.copytree(folder, forged)
    forge(forged, also_tagging_the_victim)
    before = engine_images(address)
    # swapped once every check has passed, as the engine's images are listed before the load
    swap = (f'if [ "$1 $2" = "image ls" ] && [ ! -e {tmp_path}/swapped ]; then : > {tmp_path}/swapped; '
            f"cp {forged}/demo-llm-1.1.tar.zst {folder}/; fi")
    result, errors = apply(folder, docker_env(tmp_path, address, swap, "swapping"))
    assert (tmp_path / "swapped").exists()
    assert result.returncode == 3 and len(errors) == 1, result.stdout + result.stderr
    assert "the archive changed after sha256sum -c read it" in errors[0] and "docker load refused it" in errors[0]
    assert engine_images(address) == before


def test_a_hotfix_load_that_brings_another_image_is_undone(tmp_path, based):
    folder, address = based
    before = engine_images(address)
    rogue = tmp_path / "rogue.tar"
    rogue.write_bytes(docker_layout([layer_tar({"o": b"other\n"})], tag="demo-llm:1.1")[0])
    load = (f'if [ "$1" = load ]; then cat > /dev/null; $real load < {rogue} && $real tag demo-llm:1.1 victim:1 '
            '&& echo "Loaded image: victim:1"; exit; fi')
    result, errors = apply(folder, docker_env(tmp_path, address, load, "rogue"))
    assert result.returncode == 3 and len(errors) == 1, result.stdout + result.stderr
    assert "; what the load added was removed" in errors[0]
    # (before: demo-llm:1.1 and victim:1 stayed on the other image)
    assert engine_images(address) == before


@pytest.mark.parametrize("held", ["the base", "another image"])
def test_apply_sh_s_way_out_of_a_tag_held_by_another_image_keeps_that_image(tmp_path, based, held):
    # the engine holds the base (or another image) only under the hotfix's own tag: apply.sh refuses, and the
    # commands it names, run as written, keep that image and let it apply (before: "remove or retag it
    # first", and docker rmi demo-llm:1.1 deleted the base, which apply.sh then asked to import again)
    import re

    folder, address = based
    env = docker_env(tmp_path, address)

    def sh(command: str) -> None:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr

    def image_id(ref: str) -> str:
        return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                              text=True, env=env, check=True).stdout.strip()

    kept = image_id("demo-llm:1.0" if held == "the base" else "victim:1")
    sh(f"docker tag {kept} demo-llm:1.1 && docker rmi {'demo-llm:1.0' if held == 'the base' else 'victim:1'}")
    result, errors = apply(folder, env)
    assert result.returncode == 3 and len(errors) == 1 and "loading would move that tag" in errors[0], result.stderr
    way = re.search(r"\((docker tag \S+ \S+ && docker rmi \S+|docker rmi \S+)[;:]", errors[0])
    assert way, errors[0]
    sh(way.group(1).replace("NAME", "kept:1"))
    result, errors = apply(folder, env)
    assert result.returncode == 0 and not errors, result.stdout + result.stderr
    assert image_id(kept) == kept  # still there
    if held == "the base":
        assert image_id("demo-llm:1.0") == kept and result.stdout.endswith(
            "(demo-llm:1.0 is unchanged; roll back with IMAGE=demo-llm:1.0 ./run.sh)\n")
    else:
        assert image_id("kept:1") == kept
