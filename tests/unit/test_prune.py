"""prune: old release images and build cache leave the engine; kept releases and foreign images stay."""

from __future__ import annotations

from unibake.archive_reader import read_archive
from unibake.builder import cache_ref, keep_as_cache
from unibake.metadata import PROFILES_LABEL
from unibake.prune import prune

from ..fake_engine import FakeEngine
from ..savefixtures import layer_tar
from .test_publish import make_release


def test_prune_keeps_the_newest_releases_and_removes_the_rest(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.3.0", "1.3.1", "1.3.2")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})])
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))  # the engine holds each release's image
    dangling = engine.add({"config": {"Labels": {PROFILES_LABEL: "tp1"}}}, [b"an old build"])
    cache = engine.add({"config": {}}, [b"cache"])
    keep_as_cache(engine, cache_ref("demo-llm", "all", "build"), cache)
    foreign = engine.add({"config": {}}, [b"not ours"], tag="someone/else:1")

    planned = prune(engine, out, keep=2, dry_run=True)
    assert {r.ref for r in planned} == {"demo-llm:1.3.0", "unibake-cache/demo-llm:all-build", dangling}
    assert engine.inspect_image("demo-llm:1.3.0") is not None  # a dry run removes nothing

    prune(engine, out, keep=2)
    assert engine.inspect_image("demo-llm:1.3.0") is None
    assert engine.inspect_image("demo-llm:1.3.2") is not None and engine.inspect_image("demo-llm:1.3.1") is not None
    assert engine.inspect_image(cache_ref("demo-llm", "all", "build")) is None
    assert engine.inspect_image(foreign) is not None
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["1.3.0", "1.3.1", "1.3.2"]


def test_keeping_a_cache_role_replaces_and_removes_the_image_it_named():
    engine = FakeEngine()
    old, new = engine.add({"config": {}}, [b"old"]), engine.add({"config": {}}, [b"new"])
    ref = cache_ref("demo", "all", "build")
    keep_as_cache(engine, ref, old)
    keep_as_cache(engine, ref, new)
    assert engine.inspect_image(ref).id == new and engine.inspect_image(old) is None
    long = cache_ref("demo", "-".join(f"tp{i}" for i in range(40)), "stage1")
    assert len(long.split(":", 1)[1]) <= 128
