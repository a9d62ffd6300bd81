"""The one-pass export on fake engines: the same normalised image as the sequential path, an
archive that reads back as it, and a fresh engine that holds it, from a single save."""

from __future__ import annotations

import hashlib
import json

import pytest

from unibake.archive_reader import read_archive
from unibake.builder import BuiltImage
from unibake.errors import VerificationError
from unibake.export import export_once
from unibake.normalise import normalise_image

from ..conftest import terminated_as_the_cli
from ..fake_engine import FakeEngine
from .test_normalise import EPOCH, built, engine, layer  # noqa: F401 - the fixture is used by name


class CountingEngine(FakeEngine):
    saves: int = 0

    def save(self, ref):
        self.saves += 1
        return super().save(ref)


@pytest.fixture
def counted(engine):  # noqa: F811
    e = CountingEngine()
    e.images, e.tags = engine.images, engine.tags
    return e


def export(engine, image, tmp_path, fresh=None, **kw):
    staging = tmp_path / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    return export_once(engine, image, staging=staging, name="demo.tar.zst", epoch=EPOCH, owned="/opt/unibake",
                       base_image="base:1", fresh=fresh, **kw)


def test_one_save_gives_the_normalised_image_its_archive_and_the_fresh_engines_copy(counted, tmp_path):
    fresh = FakeEngine(address="fake://fresh")
    done = export(counted, built(counted, "demo:1", 1111, "2026-01-01T00:00:00Z"), tmp_path, fresh=fresh)
    assert counted.saves == 1
    assert counted.inspect_image("demo:1").id == done.image.image_id  # the tag names the normalised image
    assert done.archive.image.image_id == done.image.image_id == done.back.image.image_id
    held = fresh.inspect_image("demo:1")
    assert held.id == done.image.image_id and held.diff_ids == done.image.diff_ids
    assert done.round_trip.image_id == done.image.image_id and done.round_trip.engine == "fake://fresh"
    assert fresh.images[held.id].layers[0] == counted.images[counted.tags["base:1"]].layers[0]  # the base went too
    other = FakeEngine()
    other.load(read_archive(tmp_path / "staging", [f.name for f in done.archive.files]))
    assert other.inspect_image("demo:1").id == done.image.image_id  # the archive itself loads as the same image


def test_the_export_gives_what_the_sequential_path_gives(engine, tmp_path):  # noqa: F811
    one = export(engine, built(engine, "demo:1", 1111, "x"), tmp_path).image.image_id
    two = normalise_image(engine, built(engine, "demo:2", 2222, "y"), epoch=EPOCH, base_image="base:1",
                          owned="/opt/unibake").image_id
    assert one == two


def test_a_hotfix_archive_leaves_out_what_its_base_shipped_and_feeds_no_fresh_engine(engine, tmp_path):  # noqa: F811
    first = export(engine, built(engine, "demo:1", 1111, "x"), tmp_path / "a").image
    fresh = FakeEngine(address="fake://fresh")
    done = export(engine, built(engine, "demo:2", 1111, "x", tune=b'{"t": 9}\n'), tmp_path / "b", fresh=fresh,
                  omit_base=first.diff_ids)
    assert done.archive.omitted == first.diff_ids[:2] and len(done.archive.shipped) == 1
    assert fresh.loads == 0 and done.round_trip is None


def test_a_layer_outside_the_install_root_is_refused_and_nothing_is_left(engine, tmp_path):  # noqa: F811
    base = engine.images[engine.tags["base:1"]].layers
    image_id = engine.add(json.loads(engine.images[engine.tags["base:1"]].config), base + [layer([("etc/x", b"x", 5)])],
                          tag="demo:1")
    from unibake.builder import BuiltImage
    with pytest.raises(VerificationError, match="lies outside /opt/unibake"):
        export(engine, BuiltImage(image_id=image_id, tag="demo:1", diff_ids=(), steps=(), stage_images=(), seconds=0),
               tmp_path)
    assert list((tmp_path / "staging").iterdir()) == []


class RecordingEngine(FakeEngine):
    """Remembers the names of the files of every load stream it took."""

    def load(self, chunks, stop=None):
        import io
        import tarfile
        data = b"".join(chunks)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.streams = getattr(self, "streams", []) + [[m.name for m in tar.getmembers() if m.isfile()]]
        return super().load([data])


def test_a_verify_engine_holding_the_base_image_is_sent_only_the_layers_above_it(engine, tmp_path):  # noqa: F811
    base_id = engine.tags["base:1"]
    fresh = RecordingEngine(address="fake://seeded")
    fresh.load(engine.save("base:1"))  # seeded: it holds the base image, and only it
    done = export(engine, built(engine, "demo:1", 1111, "x"), tmp_path, fresh=fresh, fresh_holds=base_id)
    held = fresh.inspect_image("demo:1")
    assert held.id == done.image.image_id and held.diff_ids == done.image.diff_ids
    assert done.round_trip.held_before == (base_id,)
    base_layers = len(engine.images[base_id].layers)
    sent = [n for n in fresh.streams[-1] if n.endswith("/layer.tar")]
    assert len(sent) == len(done.image.diff_ids) - base_layers  # the base's layers were not sent again

    with pytest.raises(VerificationError, match="not the sha256:0+ the verify engine was seeded with"):
        export(engine, built(engine, "demo:2", 2222, "y"), tmp_path / "other", fresh=RecordingEngine(),
               fresh_holds="sha256:" + "0" * 64)


def test_a_hotfix_compresses_only_the_layers_it_ships_and_still_reads_every_layer_for_the_sbom(tmp_path):
    # big layers (above the spool threshold): the base image's and the engine's, which the base release
    # shipped, are not in the hotfix archive, yet the SBOM reader sees their files; a big layer of ours
    # that changed is compressed after its diffID is known and loads over the base release
    import os

    from unibake.archive_reader import read_archive
    from unibake.contents import LayerInspector

    from .test_contents import STATUS
    from .test_normalise import config, layer

    e = RecordingEngine()
    e.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}},
          [layer([("var/lib/dpkg/status", STATUS, 5), ("bin/big", os.urandom(300 << 10), 5)], uname="root")],
          tag="base:1")
    library = os.urandom(300 << 10)

    def build(tag: str, mtime: int, kernel: bytes, tune: bytes) -> object:
        base = e.images[e.tags["base:1"]].layers
        ours = [layer([("opt", None, mtime), ("opt/unibake", None, mtime), ("opt/unibake/kernels", None, mtime),
                       ("opt/unibake/kernels/libk.so", kernel, mtime)]),
                layer([("opt/unibake/profiles/tp1/tune/a.json", tune, mtime)])]
        image_id = e.add(config("x", f"c{mtime}"), base + ours, tag=tag)
        return BuiltImage(image_id=image_id, tag=tag, diff_ids=(), steps=(), stage_images=(), seconds=0.0)

    first = export(e, build("demo:1", 1111, library, b"{}\n"), tmp_path / "a")
    cases = (("tune", library, 1, first.image.image_id), ("kernel", os.urandom(300 << 10), 2, first.image.image_id),
             ("not-held", library, 1, "sha256:" + "0" * 64))
    for name, kernel, shipped, base_release in cases:
        staging = tmp_path / name / "staging"  # (where export() writes)
        done = export(e, build(f"demo:{name}", 2222, kernel, b'{"t": 2}\n'), tmp_path / name,
                      omit_base=first.image.diff_ids, inspector=LayerInspector("/opt/unibake"),
                      base_release=base_release)
        assert len(done.archive.shipped) == shipped and done.archive.omitted == first.image.diff_ids[:3 - shipped]
        # the local engine, which holds the base release, is sent only what it lacks (else both layers of ours)
        loaded_back = [n for n in e.streams[-1] if n.endswith("/layer.tar")]
        assert len(loaded_back) == (2 if name == "not-held" else shipped), name
        assert e.inspect_image(f"demo:{name}").id == done.image.image_id
        assert [p.name for p in staging.iterdir() if p.name.startswith(".")] == []  # no spool left behind
        contents = done.archive.contents
        assert {p.name for p in contents.packages} >= {"bash", "libzstd1"}  # read from the omitted base layer
        assert contents.library("/opt/unibake/kernels/libk.so").sha256 == hashlib.sha256(kernel).hexdigest()
        target = FakeEngine()
        target.load(e.save(first.image.image_id))  # the fresh engine of a hotfix holds its base release
        target.load(read_archive(staging, [f.name for f in done.archive.files]))
        held = target.inspect_image(f"demo:{name}")
        assert held.id == done.image.image_id and held.diff_ids == done.image.diff_ids
        assert target.layer(done.image.diff_ids[1]) is not None


@pytest.mark.parametrize("path", ["export", "sequential"])
def test_a_base_layer_under_the_install_root_is_refused_naming_it_not_rewritten(tmp_path, path):
    # the base's layer was rewritten like ours, and the release failed later as if the base had changed
    from unibake.errors import InputError

    from .test_normalise import config, normalise, ours

    engine = FakeEngine()
    vendor = layer([("opt/unibake/vendor", None, 5), ("opt/unibake/vendor/notes.txt", b"x\n", 5)], uname="root")
    engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}},
               [layer([("bin/sh", b"\x7fELF" + bytes(2000), 1111)], uname="root"), vendor], tag="base:1")
    base = engine.images[engine.tags["base:1"]].layers
    image_id = engine.add(config("x", "c") | {"history": [{"created_by": "x"}] * 4}, base + ours(1111), tag="demo:1")
    image = BuiltImage(image_id=image_id, tag="demo:1", diff_ids=(), steps=(), stage_images=(), seconds=0.0)
    with pytest.raises(InputError, match=r"layer 2 of the base image \(sha256:[0-9a-f]{12}\.\.\.\) starts under "
                                         r"/opt/unibake, the folder unibake owns: .* build on a base without "
                                         r"/opt/unibake"):
        export(engine, image, tmp_path) if path == "export" else normalise(engine, image)
    assert engine.inspect_image("demo:1").id == image_id  # the tag still names the build


@pytest.mark.parametrize("ends", ["interrupted", "well"])
def test_what_the_one_pass_export_loads_into_a_verify_engine_is_removed_however_the_run_ends(
        engine, tmp_path, ends):  # noqa: F811
    # its removal was handed to the clean-up only once the export had returned: an interrupt (or an error) after the
    # load was done, as its result was checked, left the image in the --verify-engine under the release's tag
    import os
    import signal
    from contextlib import ExitStack
    from types import SimpleNamespace

    from unibake.pipeline import Request, Run, _export

    from .test_supply_chain import Quiet

    class InterruptedAfterTheLoad(FakeEngine):
        fired: bool = False

        def inspect_image(self, ref):  # the export's look at what the load brought
            if self.loads and not self.fired and ends == "interrupted":
                self.fired = True
                os.kill(os.getpid(), signal.SIGTERM)
            return super().inspect_image(ref)

    verify = InterruptedAfterTheLoad(address="fake://verify")
    image = built(engine, "demo:1", 1111, "x")
    engines = {None: engine, "fake://verify": verify}
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", verify_engine="fake://verify")
    (tmp_path / "staging").mkdir()
    with terminated_as_the_cli():
        with ExitStack() as stack:
            run = Run(request, Quiet(), stack, engines.__getitem__)
            run.results.update(plan=SimpleNamespace(base_image="base:1", platform=None, product="demo",
                                                    project_root=tmp_path), built=image,
                               target=SimpleNamespace(archive_name="demo.tar.zst"),
                               folder=SimpleNamespace(staging=tmp_path / "staging"),
                               context=SimpleNamespace(selection="all"))
            if ends == "interrupted":
                with pytest.raises(KeyboardInterrupt):
                    _export(run)
            else:
                _export(run)
                assert verify.inspect_image("demo:1") is not None  # there while the run goes on (its smoke gates)
    assert verify.loads == 1 and (verify.images, verify.tags) == ({}, {})


def test_a_verify_engine_that_held_the_image_before_the_one_pass_load_is_refused_and_keeps_it(engine, tmp_path):  # noqa: F811
    # the sequential round trip refuses a --verify-engine holding the image (its ID known before the load); the one
    # pass knows it only after, and took the image's presence there as the proof, then removed the engine's own image
    from contextlib import ExitStack
    from types import SimpleNamespace

    from unibake.pipeline import Request, Run, _export

    from .test_supply_chain import Quiet

    image = built(engine, "demo:1", 1111, "x")

    def export_into(verify: FakeEngine, out: str):
        (tmp_path / out).mkdir()
        request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", verify_engine="fake://verify")
        with ExitStack() as stack:
            run = Run(request, Quiet(), stack, {None: engine, "fake://verify": verify}.__getitem__)
            run.results.update(plan=SimpleNamespace(base_image="base:1", platform=None, product="demo",
                                                    project_root=tmp_path), built=image,
                               target=SimpleNamespace(archive_name="demo.tar.zst"),
                               folder=SimpleNamespace(staging=tmp_path / out),
                               context=SimpleNamespace(selection="all"))
            _export(run)
            return verify.inspect_image("demo:1").id, dict(verify.images)

    first = FakeEngine(address="fake://verify")
    image_id, images = export_into(first, "a")
    assert first.images == {}  # (removed as the run ended)
    verify = FakeEngine(address="fake://verify")
    verify.images.update(images)
    verify.tags["theirs:1"] = image_id  # an earlier run's, or its own
    with pytest.raises(VerificationError, match=r"the verify engine at fake://verify already held sha256:[0-9a-f]+ "
                                                r"before the load: a load there proves nothing"):
        export_into(verify, "b")
    assert verify.tags == {"theirs:1": image_id} and image_id in verify.images  # its image, and its name, kept


def test_a_hotfix_s_bottom_layers_held_as_recorded_give_the_very_archive_and_contents_of_reading_them(engine,  # noqa: F811
                                                                                                     tmp_path):
    # an assembled hotfix takes its base release's bottom layers from what that release's pass recorded of
    # them (their sizes, what the SBOM's reader found), not from its archive: the same archive, image and SBOM
    from unibake.contents import LayerInspector, found_from_json, found_to_json
    from unibake.export import SaveSource
    from unibake.imagetar import member_json, read_members, without_members

    recorder = LayerInspector("/opt/unibake")
    base = engine.images[engine.tags["base:1"]].layers
    kernels = layer([("opt", None, 5), ("opt/unibake", None, 5), ("opt/unibake/kernels", None, 5),
                     ("opt/unibake/kernels/libk.so", b"\x7fELF kernel" * 100, 5)])
    demo = engine.add(json.loads(engine.images[engine.tags["base:1"]].config), base + [kernels, layer(
        [("opt/unibake/profiles/tp1/tune/a.json", b'{"t": 1}\n', 5)])], tag="demo:1")
    first = export(engine, BuiltImage(image_id=demo, tag="demo:1", diff_ids=(), steps=(), stage_images=(), seconds=0),
                   tmp_path / "a", inspector=recorder)
    shipped = engine.images[first.image.image_id].layers  # the base release's layers, as it shipped them
    records = [(d, m.size, found_from_json(json.loads(json.dumps(found_to_json(recorder.found(m.name))))))
               for m, d in zip(first.archive.image.layer_members[:2], first.image.diff_ids[:2])]
    tune = layer([("opt/unibake/profiles/tp1/tune/a.json", b'{"t": 9}\n', 3333)])
    raw = dict(json.loads(engine.images[first.image.image_id].config), container="c3")
    hot = BuiltImage(image_id=engine.add(raw, shipped[:2] + [tune], tag="demo:2"), tag="demo:2", diff_ids=(), steps=(),
                     stage_images=(), seconds=0.0)

    whole = export(engine, hot, tmp_path / "whole", omit_base=first.image.diff_ids,
                   inspector=LayerInspector("/opt/unibake"))
    names = member_json(read_members(engine.save("demo:2")), "manifest.json")[0]["Layers"]
    preloaded = LayerInspector("/opt/unibake")
    for name, (_, _, found) in zip(names, records):
        preloaded.preload(name, found)
    held = export(engine, hot, tmp_path / "held", omit_base=first.image.diff_ids, inspector=preloaded,
                  source=SaveSource(stream=without_members(engine.save("demo:2"), frozenset(names[:2])), held={
                      name: (i, d, size) for i, (name, (d, size, _)) in enumerate(zip(names, records))}))
    assert held.image.image_id == whole.image.image_id and held.archive.omitted == first.image.diff_ids[:2]
    assert [(tmp_path / "held" / "staging" / f.name).read_bytes() for f in held.archive.files] == \
        [(tmp_path / "whole" / "staging" / f.name).read_bytes() for f in whole.archive.files]
    assert held.archive.contents == whole.archive.contents and held.archive.contents.libraries  # (the SBOM's)
    assert engine.inspect_image("demo:2").id == held.image.image_id  # loaded: its bottom layers the engine's own

    wrong = {name: (i, "sha256:" + "9" * 64, size) for i, (name, (d, size, _)) in enumerate(zip(names, records))}
    with pytest.raises(VerificationError):  # a held layer that is not the base release's: refused
        export(engine, hot, tmp_path / "wrong", omit_base=first.image.diff_ids, inspector=LayerInspector("/opt/unibake"),
               source=SaveSource(stream=without_members(engine.save("demo:2"), frozenset(names[:2])), held=wrong))
