"""repro's comparison, on its own and on the fake engine: the layer and the entries that differ."""

from __future__ import annotations

import re

import pytest

from unibake.errors import VerificationError
from unibake.repro import ReproBuild, compare

from ..conftest import terminated_as_the_cli
from ..fake_engine import FakeEngine
from .test_normalise import layer

D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def test_identical_builds_are_reproducible():
    build = ReproBuild(image_id=D1, diff_ids=(D2, D3), archive_sha256="a" * 64)
    report = compare(FakeEngine(), "demo:1", build, build)
    assert report.reproducible and report.layer is None
    report.raise_if_different()
    assert [row[-1] for row in report.rows()] == ["same"] * 4


def test_builds_that_differ_only_in_their_config_say_so():
    a = ReproBuild(image_id=D1, diff_ids=(D2,), archive_sha256="a" * 64)
    b = ReproBuild(image_id=D3, diff_ids=(D2,), archive_sha256="b" * 64)
    with pytest.raises(VerificationError, match="differ only in their config"):
        compare(FakeEngine(), "demo:1", a, b).raise_if_different()


def test_one_image_in_two_archives_of_other_bytes_is_said_as_such():
    # (before: "differ only in their config (sha256:1... against sha256:1...)", the same ID twice)
    a = ReproBuild(image_id=D1, diff_ids=(D2,), archive_sha256="a" * 64)
    b = ReproBuild(image_id=D1, diff_ids=(D2,), archive_sha256="b" * 64)
    with pytest.raises(VerificationError, match=rf"^the builds are the same image \({D1}\), but its archives differ "
                                                rf"\(sha256 {'a' * 64} against {'b' * 64}\)"):
        compare(FakeEngine(), "demo:1", a, b).raise_if_different()


def test_builds_of_other_layer_counts_say_so_and_show_every_layer():
    # (before: the layers were paired with zip: the extra one was left out, and the report said "config only")
    a = ReproBuild(image_id=D1, diff_ids=(D2,), archive_sha256="a" * 64)
    b = ReproBuild(image_id=D3, diff_ids=(D2, D3), archive_sha256="b" * 64)
    report = compare(FakeEngine(), "demo:1", a, b)
    assert [row[0] for row in report.rows()] == ["image ID", "layer 1", "layer 2", "archive sha256"]
    assert report.rows()[2] == ["layer 2", "(none)", D3, "DIFFERENT"]
    with pytest.raises(VerificationError, match=r"^not reproducible: the first build has 1 layer, the second 2; "
                                                r"layer 2 is the first that differs$"):
        report.raise_if_different()


def test_the_first_differing_layer_is_listed_entry_by_entry():
    engine = FakeEngine()
    base = layer([("bin/sh", b"sh", 1)])
    one = engine.add({"config": {}}, [base, layer([("opt/unibake/a.so", b"built at 10:00", 5)])])
    two = engine.add({"config": {}}, [base, layer([("opt/unibake/a.so", b"built at 10:01", 5)])])
    a = ReproBuild(image_id=one, diff_ids=tuple(engine.inspect_image(one).diff_ids), archive_sha256="a" * 64)
    b = ReproBuild(image_id=two, diff_ids=tuple(engine.inspect_image(two).diff_ids), archive_sha256="b" * 64)
    report = compare(engine, "demo:1", a, b)
    assert report.differing_layers == [1]
    assert [p for p, _ in report.layer.entries] == ["opt/unibake/a.so"]
    assert report.layer.entries[0][1].startswith("content ")
    with pytest.raises(VerificationError, match=r"not reproducible: layer 2 differs \(1 entries\), first "
                                                r"opt/unibake/a.so: content"):
        report.raise_if_different()
    assert report.document()["layer"]["entries"][0]["path"] == "opt/unibake/a.so"


def test_a_holding_tag_that_cannot_be_removed_is_warned_of_and_the_runs_own_error_is_kept(monkeypatch, tmp_path):
    # the second build failed, then removing the first build's tag failed too (the engine gone): the
    # tag's EngineError replaced the build's error, and the second tag was not tried
    from types import SimpleNamespace

    import unibake.pipeline as pipeline
    from unibake.errors import BuildFailed, EngineError
    from unibake.pipeline import Request, reproduce

    from .test_supply_chain import Quiet

    class Gone(FakeEngine):
        def remove_image(self, ref):
            self.tried = [*getattr(self, "tried", []), ref]
            raise EngineError(f"cannot reach the Docker engine at {self.address}")

    def run_stages(stages, request, reporter, *, connect):  # build 1 ends well, build 2 fails
        if request.hold.startswith("2-"):
            raise BuildFailed("the build failed at Step 3: RUN make")
        image = SimpleNamespace(ref=f"unibake-repro/demo:{request.hold}", image_id=D1, diff_ids=(D2,))
        return {"image": image, "proof": SimpleNamespace(back=SimpleNamespace(compressed_sha256="a" * 64))}
    monkeypatch.setattr(pipeline, "run_stages", run_stages)
    engine, reporter = Gone(), Quiet()
    with pytest.raises(BuildFailed, match="the build failed at Step 3"):
        reproduce(Request(env={}, cwd=tmp_path), reporter, connect=lambda address: engine)
    (tried,) = engine.tried
    assert re.fullmatch(r"unibake-repro/demo:1-[0-9]+x[0-9a-f]{6}", tried), tried  # (a tag of this run's own)
    assert f"{tried} is left in the engine: cannot reach the Docker engine at fake://engine" in \
        reporter.stream.getvalue()


def test_an_interrupt_as_repro_s_temporary_folder_is_made_leaves_no_folder(tmp_path, monkeypatch):
    # (before: the folder was made before its removal was handed to the clean-up: a Ctrl-C or SIGTERM as mkdtemp
    # returned left an empty unibake-repro-* folder in the temporary folder)
    import os
    import signal
    import tempfile
    from contextlib import ExitStack

    from unibake.pipeline import Request, Run, _temp_folder

    from .test_supply_chain import Quiet

    real = tempfile.mkdtemp

    def made_then_interrupted(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the folder is there; the signal lands as mkdtemp returns it
        return made

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "mkdtemp", made_then_interrupted)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            with ExitStack() as stack:
                _temp_folder(Run(Request(env={}, cwd=tmp_path, out=tmp_path / "release"), Quiet(), stack,
                                 lambda address: None))
    assert os.listdir(tmp_path / "tmp") == []
