"""The image read from the engine's own storage (unibake.layerstore): the same archive, byte for byte, as from
the engine's save; and a storage that does not hold the image's bytes is never believed: the archive is
written from the save instead, with a warning that says why."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from unibake.archive import write_archive
from unibake.export import SaveSource, export_once
from unibake.layerstore import FROM_STORE, PIECE, archive_image, chain_ids, find_image
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL
from unibake.normalise import normalise_image
from unibake.pipeline import ARCHIVE, Request, run_stages, selection
from unibake.verify import verify_folder

from ..fake_engine import FakeEngine
from ..savefixtures import config_for, tar_of
from ..storefixture import layer_files, write_store
from .test_normalise import BASE_LAYER_ENTRIES, EPOCH, built, layer as normalise_layer
from .test_pipeline import Quiet
from .test_smoke import metadata, server  # noqa: F401 - the fixture is used by name

TAG = "demo:1"
SECRET = b"the builder's own secret, never in an archive\n"


def image_layers() -> list[bytes]:
    """Layers with what a layer tar holds: folders, a long name (a PAX record), a name that is not UTF-8,
    an empty file, a link, a hard link, a whiteout, and files bigger than the stream's pieces."""
    big = hashlib.sha256(b"seed").digest() * ((PIECE * 3) // 32 + 7)
    return [
        tar_of([("bin", None, None), ("bin/tool", b"\x7fELF" + bytes(3000), None),
                ("bin/sh", b"", {"type": tarfile.SYMTYPE, "linkname": "tool"}),
                ("bin/empty", b"", None), ("opt", None, None), ("opt/old.txt", b"old\n", None)]),
        tar_of([("opt", None, None), ("opt/" + "long-name-" * 20 + ".so", big, None),
                ("opt/caf\udce9.txt", b"latin-1 name\n", None),
                ("opt/same", b"", {"type": tarfile.LNKTYPE, "linkname": "bin/tool"}),
                ("opt/.wh.old.txt", b"", None), ("opt/tail.bin", big[:PIECE + 5], None)]),
        tar_of([("opt", None, None), ("opt/tune.json", b"{}\n", None)]),
    ]


@dataclass
class StoreEngine(FakeEngine):
    """The fake engine (its save written independently, in Engine 20.10's layout) with a storage folder."""

    root: Path | None = None
    driver: str = "overlay2"

    def storage(self):
        return (str(self.root), self.driver) if self.root is not None else "it does not say"


@pytest.fixture
def stored(tmp_path):
    layers = image_layers()
    config = config_for(layers)
    engine = StoreEngine(root=tmp_path / "docker")
    image_id = engine.add(json.loads(config), layers, tag=TAG)
    assert write_store(engine.root, engine.images[image_id].config, layers) == image_id
    return engine, image_id, engine.inspect_image(TAG).diff_ids


def archived(engine, folder: Path, **options) -> tuple[bytes, list[str], list[str]]:
    """The archive's bytes written by archive_image, with what it said (where it read, and any fallback)."""
    said: list[str] = []
    warned: list[str] = []
    info = engine.inspect_image(TAG)
    folder.mkdir()
    archive_image(engine, TAG, image_id=info.id, on_source=said.append,
                  on_fallback=warned.append, write=lambda chunks: write_archive(chunks, folder, "a.tar.zst", tag=TAG),
                  **options)
    assert sorted(os.listdir(folder)) == ["a.tar.zst"]  # nothing else left behind, a first pass's spools neither
    return (folder / "a.tar.zst").read_bytes(), said, warned


def test_the_storage_gives_the_archive_the_save_gives_byte_for_byte(stored, tmp_path):
    engine, _, _ = stored
    from_store, said, warned = archived(engine, tmp_path / "store")
    from_save, said_save, _ = archived(engine, tmp_path / "save", use_store=False)
    assert said[0].startswith(FROM_STORE) and warned == []
    assert said_save == ["read through the engine's save (--engine-save)"]
    assert from_store == from_save


def test_the_config_archive_is_the_stream_without_its_layer_files(stored):
    """What a seeded verify engine is given to make the base image from layers its round trip loaded: the
    image's own config and manifest, each layer named by its chain ID (as the engine looks it up), no layer file."""
    engine, image_id, diff_ids = stored
    image = find_image(engine.root, "overlay2", image_id)

    def members(data: bytes) -> dict[str, bytes]:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}

    whole, alone = members(b"".join(image.stream())), members(image.config_archive())
    assert sorted(alone) == sorted(name for name in whole if not name.endswith("/layer.tar"))
    assert alone == {name: whole[name] for name in alone}
    assert "sha256:" + hashlib.sha256(alone[image_id.removeprefix("sha256:") + ".json"]).hexdigest() == image_id
    (entry,) = json.loads(alone["manifest.json"])
    assert entry["Layers"] == [f"{c.removeprefix('sha256:')}/layer.tar" for c in chain_ids(diff_ids)]


def test_a_changed_file_of_the_same_size_is_found_by_its_diffid_and_the_save_is_read(stored, tmp_path):
    engine, image_id, diff_ids = stored
    tool = layer_files(engine.root, list(diff_ids), 0) / "bin" / "tool"
    tool.write_bytes(b"\x7fELF" + b"X" * 3000)
    got, said, warned = archived(engine, tmp_path / "a")
    assert said[0].startswith(FROM_STORE)
    assert len(warned) == 1 and f"did not give {TAG}'s own bytes" in warned[0] and "diffID" in warned[0] \
        and "written from the engine's save instead" in warned[0]
    assert got == archived(engine, tmp_path / "b", use_store=False)[0]


@pytest.mark.parametrize("change, words", [
    ("grown", "is not the regular file of 3004 bytes its tar-split record names"),
    ("missing", "cannot be read: No such file or directory"),
    ("link", "cannot be read: Too many levels of symbolic links"),
    ("folder link", "lies under 'bin', which is not a folder of the layer (a link?)"),
    ("record", "names a file outside the layer ('../../../../secret')"),
    ("garbled", "tar-split record cannot be read"),
    ("reordered", "has an entry out of its place"),
])
def test_a_storage_that_does_not_hold_the_layer_as_recorded_is_left_for_the_save(stored, tmp_path, change, words):
    engine, image_id, diff_ids = stored
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    files = layer_files(engine.root, list(diff_ids), 0)
    tool = files / "bin" / "tool"
    chain = engine.root / "image" / "overlay2" / "layerdb" / "sha256" / diff_ids[0].removeprefix("sha256:")
    split = chain / "tar-split.json.gz"
    if change == "grown":
        tool.write_bytes(tool.read_bytes() + b"more")
    elif change == "missing":
        tool.unlink()
    elif change == "link":  # a file of the layer turned into a link to one outside it: never followed
        tool.unlink()
        tool.symlink_to(secret)
    elif change == "folder link":  # its folder turned into a link to a folder outside it: never followed
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "tool").write_bytes(SECRET.ljust(3004, b"!"))  # (of the recorded size: read, were it followed)
        os.rename(files / "bin", tmp_path / "bin-was")
        (files / "bin").symlink_to(outside)
    else:
        lines = gzip.decompress(split.read_bytes()).decode().splitlines()
        if change == "record":
            lines = [line.replace('"name":"bin/tool"', '"name":"../../../../secret"') for line in lines]
        elif change == "reordered":
            lines[1], lines[2] = lines[2], lines[1]
        split.write_bytes(gzip.compress("\n".join(lines).encode()) if change != "garbled" else b"\x1f\x8bnot gzip")
    got, said, warned = archived(engine, tmp_path / "a")
    assert len(warned) == 1 and words in warned[0], warned
    assert got == archived(engine, tmp_path / "b", use_store=False)[0]
    assert SECRET not in got and not any(SECRET in p.read_bytes() for p in (tmp_path / "a").iterdir())


def test_where_the_storage_cannot_serve_the_image_the_save_is_read_and_the_reason_said(stored, tmp_path):
    engine, image_id, diff_ids = stored
    root = engine.root
    assert find_image(root, "vfs", image_id) == "the engine stores its layers with vfs, not overlay2"
    assert find_image(root, "overlay2", "sha256:" + "0" * 64) == \
        f"the engine's storage ({root}) holds no config that hashes to sha256:{'0' * 64}"
    assert find_image(root, "overlay2", "../etc") == "the engine reports an image ID that is no sha256 digest"
    record = root / "image" / "overlay2" / "layerdb" / "sha256" / chain_ids(diff_ids)[2].removeprefix("sha256:")
    (record / "diff").write_text("sha256:" + "1" * 64)
    assert find_image(root, "overlay2", image_id) == \
        f"the engine's storage ({root}) has no record of layer 3 ({diff_ids[2]}) under its chain ID"
    got, said, warned = archived(engine, tmp_path / "a")
    assert said == [f"read through the engine's save (the engine's storage ({root}) has no record of layer 3 "
                    f"({diff_ids[2]}) under its chain ID)"] and warned == []
    config = root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / image_id.removeprefix("sha256:")
    config.write_bytes(config.read_bytes() + b" ")  # a config that no longer hashes to the image's ID
    assert archived(engine, tmp_path / "b")[1] == [
        f"read through the engine's save (the engine's storage ({root}) holds no config that hashes to {image_id})"]
    engine.root = None
    assert archived(engine, tmp_path / "c")[1] == ["read through the engine's save (it does not say)"]


def test_an_archive_release_from_a_storage_that_lies_is_made_from_the_save_and_says_so(stored, tmp_path, server):  # noqa: F811
    engine, image_id, diff_ids = stored
    source = StoreEngine(address="fake://source", root=tmp_path / "docker2")
    labels = {METADATA_LABEL: metadata(server.server_port).to_json(), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.0", "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 3}, image_layers(), tag="demo:1.0")
    held = source.images[source.tags["demo:1.0"]]
    write_store(source.root, held.config, held.layers)
    tool = layer_files(source.root, list(source.inspect_image("demo:1.0").diff_ids), 0) / "bin" / "tool"
    tool.write_bytes(b"\x7fELF" + b"Y" * 3000)
    sums = {}
    for engine_save in (False, True):
        reporter = Quiet()
        engines = {None: source, "fake://verify": FakeEngine(address="fake://verify")}
        request = Request(env={}, cwd=tmp_path, out=tmp_path / f"out{engine_save}", image="demo:1.0",
                          verify_engine="fake://verify", engine_save=engine_save)
        folder = run_stages(selection(ARCHIVE), request, reporter, connect=engines.__getitem__)["release"].folder
        said = reporter.stream.getvalue()
        if engine_save:
            assert "demo:1.0: read through the engine's save (--engine-save)" in said and "warning" not in said
        else:
            assert f"demo:1.0: {FROM_STORE} ({source.root})" in said
            assert "warning: the engine's storage did not give demo:1.0's own bytes (layer 1" in said, said
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["image_id"] == held.id and not verify_folder(folder).failures
        sums[engine_save] = manifest["archive"]["sha256"]
    assert sums[False] == sums[True]


def test_the_one_pass_export_from_a_storage_that_lies_runs_again_from_the_save(tmp_path):
    engine = StoreEngine(root=tmp_path / "docker")
    engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}},
               [normalise_layer(BASE_LAYER_ENTRIES, uname="root")], tag="base:1")
    image = built(engine, "demo:1", 1111, "2026-01-01T00:00:00Z")
    held = engine.images[image.image_id]
    write_store(engine.root, held.config, held.layers)
    served = layer_files(engine.root, json.loads(held.config)["rootfs"]["diff_ids"], 1) / "opt/unibake/engine/serve.py"
    served.write_bytes(served.read_bytes().replace(b"serve", b"SERVE"))
    fresh = FakeEngine(address="fake://fresh")
    warned, staging = [], tmp_path / "staging"
    staging.mkdir()
    done = archive_image(engine, image.tag, image_id=image.image_id, on_fallback=warned.append,
                         write=lambda chunks: export_once(engine, image, staging=staging, name="demo.tar.zst",
                                                          epoch=EPOCH, owned="/opt/unibake", base_image="base:1",
                                                          fresh=fresh, source=SaveSource(stream=chunks)))
    assert len(warned) == 1 and "does not match the image's diffID" in warned[0], warned
    other = FakeEngine()
    again = normalise_image(other_with(other, engine, image), image, epoch=EPOCH, base_image="base:1",
                            owned="/opt/unibake")
    assert done.image.image_id == again.image_id  # what the save gives, not what the storage held
    assert fresh.inspect_image("demo:1").id == done.image.image_id and len(fresh.images) == 1
    assert sorted(os.listdir(staging)) == ["demo.tar.zst"]


def other_with(other: FakeEngine, engine: FakeEngine, image) -> FakeEngine:
    """A second fake engine holding the base and the built image as ``engine`` held them before its export."""
    other.images = dict(engine.images)
    other.tags = {"base:1": engine.tags["base:1"], "demo:1": image.image_id}
    return other


def _top_layers(small) -> list[bytes]:
    from unibake.assemble import _layer_members

    stream = b"".join(_layer_members(small.path, small.layers[2:]))
    with tarfile.open(fileobj=io.BytesIO(stream + bytes(1024)), mode="r:") as tar:
        return [tar.extractfile(m).read() for m in tar]


def test_an_assembled_release_on_the_memo_image_takes_only_its_top_layers_from_the_storage(stored, tmp_path):
    from unibake.assemble import Assembly, save_small

    engine, image_id, diff_ids = stored
    assembly = Assembly(small=image_id, lower_layers=2, lower_history=(), checks="true", shell=("/bin/sh", "-c"),
                        checks_created_by="/bin/sh -c true", checks_at=2, on_memo=True)
    warned: list[str] = []
    saved = []
    engine.save = lambda ref, _save=engine.save: saved.append(ref) or _save(ref)  # (counted: never asked here)
    small = save_small(engine, assembly, tmp_path, on_fallback=warned.append)
    assert saved == [] and warned == [] and small.diff_ids == tuple(diff_ids) and len(small.layers) == 3
    with tarfile.open(small.path, "r:") as spool:  # the manifest names every layer; only the top one is carried
        assert [m.name for m in spool if m.name.endswith("layer.tar")] == [small.layers[2]]
    assert _top_layers(small) == [image_layers()[2]]
    small.path.unlink()
    # a top layer's file changed at the same size: its diffID tells, and the whole image's save is read instead
    (layer_files(engine.root, list(diff_ids), 2) / "opt" / "tune.json").write_bytes(b"[]\n")
    small = save_small(engine, assembly, tmp_path, on_fallback=warned.append)
    assert saved == [image_id] and len(warned) == 1 and "did not give the small image's own top layers" in warned[0]
    assert _top_layers(small) == [image_layers()[2]] and small.diff_ids == tuple(diff_ids)
    # nothing else left in the staging folder: the first try's spool was written over
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == [small.path.name]
