"""Engine tests run against the real Docker engine; they fail (never skip) when none answers."""

from __future__ import annotations

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
