"""Engine tests run against the real Docker engine; they fail (never skip) when none answers."""

from __future__ import annotations

import io
import tarfile
import uuid

import pytest

from unibake.docker_engine import DockerEngine
from unibake.errors import EngineError


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
