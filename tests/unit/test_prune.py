"""prune: old release images and build cache leave the engine; kept releases and foreign images stay."""

from __future__ import annotations

import json

from unibake.archive_reader import read_archive
from unibake.builder import cache_ref, keep_as_cache
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL
from unibake.prune import prune

from ..fake_engine import FakeEngine
from ..savefixtures import layer_tar
from .test_publish import METADATA, make_release


def built_by_unibake(tag: str) -> dict[str, str]:
    """The labels unibake's build gives a release's image: its metadata names the product and tag."""
    return {METADATA_LABEL: json.dumps({**METADATA, "version": tag, "tag": f"demo-llm:{tag}"})}


def test_prune_keeps_the_newest_releases_and_removes_the_rest(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.3.0", "1.3.1", "1.3.2")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
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


def test_a_folder_naming_an_image_unibake_did_not_make_removes_nothing(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.0", "1.1")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))
    foreign = engine.add({"config": {}}, [b"a database"], tag="postgres:15")
    forged = out / "zz-forged"  # a folder holding only a manifest that names the foreign image, as old
    forged.mkdir()
    manifest = json.loads((out / "1.0" / "manifest.json").read_text())
    manifest.update(tag="postgres:15", image_id=foreign, published="1970-01-01T00:00:00Z")
    (forged / "manifest.json").write_text(json.dumps(manifest))
    planned = prune(engine, out, keep=1)
    assert "postgres:15" not in {r.ref for r in planned} and engine.inspect_image("postgres:15") is not None
    assert engine.inspect_image("demo-llm:1.0") is None  # the real old release still goes
