"""Normalise on the fake engine: the same inputs give the same image ID however they were built,
the base image is untouched, and what it cannot normalise is refused."""

from __future__ import annotations

import io
import os
import json
import tarfile

import pytest

from unibake.builder import BuiltImage
from unibake.errors import ArchiveError, EngineError, VerificationError
from unibake import normalise as normalise_module
from unibake.normalise import EPOCH_LABEL, normalise_image

from ..fake_engine import FakeEngine
from ..savefixtures import tar_of

EPOCH = 1700000000
BASE_LAYER_ENTRIES = [("bin/sh", b"\x7fELF" + bytes(2000), 1111)]


def layer(entries, uname="builder") -> bytes:
    """A layer tar of (name, data or None for a folder, mtime) entries, as an engine writes them."""
    return tar_of([(name, data, {"mtime": mtime, "uname": uname, "gname": uname}) for name, data, mtime in entries])


def ours(mtime: int, tune: bytes = b'{"t": 1}\n') -> list[bytes]:
    return [layer([("opt", None, mtime), ("opt/unibake", None, mtime), ("opt/unibake/engine", None, mtime),
                   ("opt/unibake/engine/serve.py", b"print('serve')\n" * 50, mtime)]),
            layer([("opt/unibake/profiles/tp1/tune/a.json", tune, mtime + 7)])]


def config(created: str, container: str) -> dict:
    return {"architecture": "amd64", "os": "linux", "created": created, "container": container,
            "docker_version": "20.10.24", "container_config": {"Hostname": container},
            "config": {"Env": ["PATH=/bin"], "Labels": {"org.opencontainers.image.title": "demo"},
                       "Image": "sha256:" + "b" * 64},
            "history": [{"created": created, "created_by": "base"}, {"created": created, "created_by": "COPY"},
                        {"created": created, "created_by": "COPY tune"}]}


@pytest.fixture
def engine() -> FakeEngine:
    e = FakeEngine()
    e.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}},
          [layer(BASE_LAYER_ENTRIES, uname="root")], tag="base:1")
    return e


def built(engine: FakeEngine, tag: str, mtime: int, created: str, **kw) -> BuiltImage:
    base = engine.images[engine.tags["base:1"]].layers
    image_id = engine.add(config(created, f"c{mtime}"), base + ours(mtime, **kw), tag=tag)
    return BuiltImage(image_id=image_id, tag=tag, diff_ids=(), steps=(), stage_images=(), seconds=0.0)


def normalise(engine, image, **kw):
    return normalise_image(engine, image, epoch=EPOCH, base_image="base:1", owned="/opt/unibake", **kw)


def test_two_builds_at_different_times_give_the_same_image(engine):
    first = normalise(engine, built(engine, "demo:1", 1111, "2026-01-01T00:00:00Z"))
    second = normalise(engine, built(engine, "demo:2", 2222, "2026-06-01T00:00:00Z"))
    assert first.image_id == second.image_id
    assert engine.inspect_image("demo:1").id == first.image_id  # the tag names the normalised image


def test_the_layers_of_ours_carry_the_epoch_and_the_base_is_untouched(engine):
    image = normalise(engine, built(engine, "demo:1", 1111, "2026-01-01T00:00:00Z"))
    stored = engine.images[image.image_id]
    assert stored.layers[0] == engine.images[engine.tags["base:1"]].layers[0]
    for data in stored.layers[1:]:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert {(m.mtime, m.uname, m.gname) for m in tar.getmembers()} == {(EPOCH, "", "")}
    cfg = json.loads(stored.config)
    assert cfg["created"] == "2023-11-14T22:13:20Z"
    assert {h["created"] for h in cfg["history"]} == {"2023-11-14T22:13:20Z"}
    assert "container" not in cfg and "docker_version" not in cfg and "Image" not in cfg["config"]
    assert cfg["config"]["Labels"][EPOCH_LABEL] == str(EPOCH)
    assert image.save_bytes > sum(len(x) for x in stored.layers)  # the whole save stream was read once


def test_a_change_in_a_tune_cache_changes_only_its_layer(engine):
    a = normalise(engine, built(engine, "demo:1", 1111, "x"))
    b = normalise(engine, built(engine, "demo:2", 1111, "x", tune=b'{"t": 2}\n'))
    assert a.diff_ids[:2] == b.diff_ids[:2] and a.diff_ids[2] != b.diff_ids[2]


def test_a_layer_outside_the_install_root_that_is_not_the_base_is_refused(engine):
    base = engine.images[engine.tags["base:1"]].layers
    stray = layer([("etc/motd", b"hello", 5)])
    image_id = engine.add(config("x", "c"), base + [stray] + ours(1), tag="demo:1")
    with pytest.raises(VerificationError, match=r"layer 2 \(sha256:[0-9a-f]+\) lies outside /opt/unibake"):
        normalise(engine, BuiltImage(image_id=image_id, tag="demo:1", diff_ids=(), steps=(), stage_images=(),
                                     seconds=0.0))


def test_a_missing_base_image_is_named(engine):
    image = built(engine, "demo:1", 1111, "x")
    engine.remove_image("base:1")
    with pytest.raises(EngineError, match="the base image base:1 is gone from the engine"):
        normalise(engine, image)


def test_a_build_taken_wholly_from_the_cache_is_not_rewritten_again(engine, tmp_path):
    image = built(engine, "demo:1", 1111, "x")
    first = normalise(engine, image, cache=tmp_path)
    loads = engine.loads
    again = normalise(engine, image, cache=tmp_path)
    assert again.image_id == first.image_id and engine.loads == loads
    cold = normalise(engine, image, cache=tmp_path, reuse=False)  # a cold build looks again
    assert cold.image_id == first.image_id and engine.loads == loads + 1



def test_the_normalise_memos_keep_the_newest_and_the_ones_in_use(engine, tmp_path, monkeypatch):
    """One memo per build, for ever, before: the folder now keeps MEMOS_KEPT, a memo used again counting as new."""
    monkeypatch.setattr(normalise_module, "MEMOS_KEPT", 2)
    a, b = built(engine, "demo:1", 1111, "x"), built(engine, "demo:2", 2222, "x", tune=b'{"t": 2}\n')
    normalise(engine, a, cache=tmp_path)
    normalise(engine, b, cache=tmp_path)
    memo_a, memo_b = (next(tmp_path.glob(f"*{i.image_id.removeprefix('sha256:')}*")) for i in (a, b))
    os.utime(memo_a, (1000, 1000))
    os.utime(memo_b, (2000, 2000))
    loads = engine.loads
    normalise(engine, a, cache=tmp_path)  # taken back: now the newest
    assert engine.loads == loads
    c = built(engine, "demo:3", 3333, "x", tune=b'{"t": 3}\n')
    normalise(engine, c, cache=tmp_path)
    assert {m.name for m in tmp_path.iterdir()} == \
        {memo_a.name, next(tmp_path.glob(f"*{c.image_id.removeprefix('sha256:')}*")).name}


@pytest.mark.parametrize("planted", ["another image", "garbage", "empty", "a folder"])
def test_a_damaged_or_planted_normalise_memo_means_a_rewrite_never_another_image(engine, tmp_path, planted):
    image = built(engine, "demo:1", 1111, "x")
    first = normalise(engine, image, cache=tmp_path)
    [memo] = list(tmp_path.iterdir())
    memo.unlink()
    if planted == "a folder":
        memo.mkdir()
    else:
        memo.write_text({"another image": engine.tags["base:1"] + "\n", "garbage": "../../x\n",
                         "empty": ""}[planted])
    loads = engine.loads
    again = normalise(engine, image, cache=tmp_path)
    assert again.image_id == first.image_id and engine.loads == loads + 1
    assert engine.inspect_image("demo:1").id == first.image_id


def test_a_corrupt_layer_in_the_save_stream_is_refused(engine):
    image = built(engine, "demo:1", 1111, "x")
    stored = engine.images[image.image_id]
    damaged = bytearray(stored.layers[1])
    damaged[damaged.index(b"print('serve')")] ^= 0x01  # a file's content: the layer is no longer its diffID
    stored.layers[1] = bytes(damaged)
    with pytest.raises(ArchiveError, match=r"layer 2 .* does not match the image's diffID"):
        normalise(engine, image)
