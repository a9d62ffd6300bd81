"""Engine tests run against the real Docker engine; they fail (never skip) when none answers."""

from __future__ import annotations

import io
import tarfile
import uuid

import pytest

from unibake.builder import CACHE_REPOSITORY
from unibake.docker_engine import DockerEngine
from unibake.errors import EngineError
from unibake.scratch import SEED_PREFIX, private_base, remove_scratch_dir


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/engine/" in str(item.fspath):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    try:
        found = DockerEngine()
        found.version()
    except EngineError as exc:
        pytest.fail(f"engine tests need a Docker engine ({exc}); run scripts/setup.sh first", pytrace=False)
    return found


def engine_state(engine: DockerEngine) -> dict[str, set[str]]:
    """What a test session may leave behind: dangling images, containers, volumes, networks, cache tags."""
    api = engine.api
    return {
        "dangling images": {i.id for i in engine.list_images(dangling=True)},
        "containers": {c["Id"] for c in api.containers(all=True)},
        "volumes": {v["Name"] for v in api.volumes().get("Volumes") or []},
        "networks": {n["Id"] for n in api.networks()},
        "build cache tags": {t for i in engine.list_images() for t in i.tags if t.startswith(f"{CACHE_REPOSITORY}/")},
    }


@pytest.fixture(scope="session", autouse=True)
def engine_left_as_found(engine):
    """The suite leaves the engine as it found it: the build cache its builds kept is removed, and
    nothing else may remain (a dangling image, a container, a volume, a network)."""
    before = engine_state(engine)
    seeds = set(private_base().glob(f"{SEED_PREFIX}*"))
    yield
    for seed in set(private_base().glob(f"{SEED_PREFIX}*")) - seeds:  # verify engines the tests' releases seeded
        if seed.is_file():
            seed.unlink()
        else:
            remove_scratch_dir(seed)
    for tag in engine_state(engine)["build cache tags"] - before["build cache tags"]:
        engine.remove_image(tag)
    after = engine_state(engine)
    grown = {kind: sorted(after[kind] - before[kind]) for kind in after if after[kind] - before[kind]}
    assert not grown, f"the test session left these in the engine: {grown}"


@pytest.fixture
def version() -> str:
    """A version no other test uses, so tags never collide with leftovers."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def images(engine):
    """Register image references to remove when the test ends."""
    refs: list[str] = []
    yield refs.append
    for ref in refs:
        engine.remove_image(ref)


def build_dockerfile(engine, tag: str, dockerfile: bytes, *, buildargs: dict | None = None,
                     nocache: bool = False) -> str:
    """Build an image from a Dockerfile alone (an image built elsewhere, by hand)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buf.seek(0)
    engine.build(buf, tag=tag, buildargs=buildargs or {}, nocache=nocache, on_line=lambda line: None)
    return tag


@pytest.fixture(scope="session")
def big_image(engine):
    """A 300 MB incompressible image, so that the archive stage lasts long enough to interrupt."""
    tag = build_dockerfile(engine, "unibake-test-big:1",
                           b"FROM localhost/unibake-busybox:1\nRUN head -c 300000000 /dev/urandom > /blob\n")
    yield tag
    engine.remove_image(tag)
