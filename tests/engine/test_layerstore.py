"""The image read from the real engine's storage (unibake.layerstore), against the engine's own save: the same
archive, byte for byte, from layers that hold what layers hold (whiteouts, an opaque folder, links, a name that
is not UTF-8, a long name, a copied-up file); and the release says which of the two it read."""

from __future__ import annotations

import hashlib

import pytest

from unibake.archive import write_archive
from unibake.docker_engine import DockerEngine
from unibake.layerstore import FROM_STORE, archive_image, stored_image

from .conftest import build_dockerfile

DOCKERFILE = b"""FROM localhost/unibake-busybox:1
RUN mkdir -p /opt/a/sub && echo one > /opt/a/sub/f && echo gone > /opt/a/gone \\
 && head -c 1000000 /dev/urandom > /opt/a/big
RUN rm /opt/a/gone && rm -rf /opt/a/sub && mkdir /opt/a/sub && echo two > /opt/a/sub/g \\
 && touch "/opt/$(printf 'caf\\351')" && ln -s big /opt/a/link && ln /opt/a/big /opt/a/hard \\
 && mkdir -p "/opt/$(printf 'd%.0s' $(seq 1 120))/x" && : > /opt/a/empty && chmod 4755 /opt/a/big
RUN chmod 2750 /opt && chown 7:9 /opt/a && mkdir -p /srv/b && chown 3:4 /srv/b && rm -rf /tmp
"""


@pytest.fixture(scope="module")
def odd_image():
    engine = DockerEngine()
    tag = build_dockerfile(engine, "unibake-test-store:1", DOCKERFILE)
    yield tag
    engine.remove_image(tag)


def test_the_engines_storage_gives_the_archive_its_save_gives(engine, odd_image, tmp_path):
    info = engine.inspect_image(odd_image)
    assert not isinstance(stored_image(engine, info.id), str)  # CI runs as root: it can be read
    archives = {}
    for use_store in (True, False):
        said, warned = [], []
        folder = tmp_path / str(use_store)
        folder.mkdir()
        archive_image(engine, odd_image, image_id=info.id, use_store=use_store,
                      on_source=said.append, on_fallback=warned.append,
                      write=lambda chunks: write_archive(chunks, folder, "a.tar.zst", tag=odd_image))
        assert warned == [] and said[0].startswith(FROM_STORE) == use_store, said
        archives[use_store] = hashlib.sha256((folder / "a.tar.zst").read_bytes()).hexdigest()
    assert archives[True] == archives[False]


def test_a_release_says_where_it_read_the_image_and_engine_save_gives_the_same_archive(cli, engine, tmp_path):
    sums = {}
    for option in ((), ("--engine-save",)):
        out = tmp_path / f"release{len(option)}"
        result = cli("archive", "localhost/unibake-busybox:1", "--out", str(out), "--tag", "bb-1", "--no-roundtrip",
                     *option)
        assert result.code == 0, result.err
        said = "read through the engine's save (--engine-save)" if option else FROM_STORE
        assert f"localhost/unibake-busybox:1: {said}" in result.err
        sums[option] = [line for line in (out / "bb-1" / "SHA256SUMS").read_text().splitlines()
                        if line.endswith(".tar.zst")]
    assert len(sums[()]) == 1 and sums[()] == sums[("--engine-save",)]

