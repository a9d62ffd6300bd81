"""What an interrupt, or a second one, must not break: a replaced release is never lost, a commit is
whole or not at all, the clean-up after Ctrl-C runs to its end, and scripts still get their JSON."""

from __future__ import annotations

import json
import os
import signal

import pytest

from unibake import cli as cli_module
from unibake.errors import InputError
from unibake.publish import ReleaseFolder
from unibake.scratch import private_base, runtime_of

from ..conftest import terminated_as_the_cli
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import engines  # noqa: F401 - the fixture is used by name


def test_a_release_set_aside_by_an_interrupted_commit_is_put_back_not_deleted(tmp_path):
    out = tmp_path / "release"
    (out / ".1.0.old").mkdir(parents=True)  # a --force run killed between the commit's two renames
    (out / ".1.0.old" / "manifest.json").write_text("the release that was whole\n")
    with pytest.raises(InputError, match="already exists"):
        with ReleaseFolder(out, "1.0", force=False):
            pass
    assert (out / "1.0" / "manifest.json").read_text() == "the release that was whole\n"
    assert not (out / ".1.0.old").exists()


def test_an_interrupt_between_the_commit_s_renames_lands_after_them_even_with_another_thread_running(
        tmp_path, monkeypatch):
    # a thread runs beside the publish (the scratch engine's stopping thread): the kernel hands it the
    # signal, and Python runs the handler in the main thread, whatever that thread's signal mask
    import threading

    from unibake import publish

    out = tmp_path / "release"
    (out / "1.0").mkdir(parents=True)
    (out / "1.0" / "old").write_text("x")
    stop = threading.Event()
    beside = threading.Thread(target=stop.wait, daemon=True)
    beside.start()
    real = os.replace
    calls = []

    def replace_then_signal(src, dst):
        real(src, dst)
        calls.append(dst)
        if len(calls) == 1:  # the old release set aside, the new one not yet in place
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # let the handler run, if it is going to, before the second rename
                threading.Event().wait(0.001)

    monkeypatch.setattr(publish.os, "replace", replace_then_signal)
    try:
        with terminated_as_the_cli():
            with pytest.raises(KeyboardInterrupt):
                with ReleaseFolder(out, "1.0", force=True) as folder:
                    (folder.staging / "new").write_text("y")
                    folder.commit()
            assert folder.committed and sorted(os.listdir(out / "1.0")) == ["new"]
            assert not (out / ".1.0.old").exists()  # set aside, then removed before the interrupt is let in
    finally:
        stop.set()


def test_a_second_interrupt_does_not_cut_the_clean_up_short(capsys):
    cli_module._interrupts.clear()
    try:
        with pytest.raises(KeyboardInterrupt):
            cli_module._terminate(signal.SIGINT, None)
        cli_module._terminate(signal.SIGINT, None)  # a held Ctrl-C: let be while the first one cleans up
        assert "still cleaning up after the interrupt" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):  # a third: the user means it, the clean-up is cut short
            cli_module._terminate(signal.SIGTERM, None)
    finally:
        cli_module._interrupts.clear()


def test_an_interrupt_after_the_commit_says_the_release_was_published(cli, tmp_path, monkeypatch):
    # the commit holds the signal until the release is whole; the run then stops with 130, and the
    # user is told the release stands rather than left to guess from "interrupted"
    def publish_then_interrupted(args, ctx):
        with ReleaseFolder(tmp_path / "release", "1.0", force=False) as folder:
            (folder.staging / "manifest.json").write_text("{}\n")
            folder.commit()
        raise KeyboardInterrupt

    monkeypatch.setitem(cli_module.HANDLERS, "releases", publish_then_interrupted)
    result = cli("--json", "releases")
    folder = tmp_path / "release" / "1.0"
    assert result.code == 130 and result.error_lines == [
        f"error: interrupted after {folder} was published whole (check it: python build.py verify {folder})"]
    assert json.loads(result.out)["error"].startswith(f"interrupted after {folder} was published")
    monkeypatch.setitem(cli_module.HANDLERS, "releases", lambda args, ctx: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli("releases").error_lines == ["error: interrupted"]  # the next run starts with none committed


def test_a_refused_command_line_and_a_failed_run_still_give_their_json(cli, tmp_path):
    refused = cli("--json", "--bogus")
    assert refused.code == 2 and json.loads(refused.out) == {
        "error": "unrecognized arguments: --bogus (see: python build.py build --help)", "exit_code": 2}
    assert cli("--bogus", "--", "--json").out == ""  # after "--" it is an argument, not the option
    document = tmp_path / "m.json"
    failed = cli("--metadata-file", str(document), "verify", str(tmp_path / "absent"))
    assert failed.code == 2 and json.loads(document.read_text())["exit_code"] == 2


def test_scratch_folders_of_the_same_name_in_different_scratch_dirs_get_different_runtimes(tmp_path):
    name = "ub-seed-0123456789abcdef"
    ours = runtime_of(private_base() / name)
    assert ours == private_base() / "ubx-ub-seed-0123456789abcdef"  # the default place: as before
    a, b = runtime_of(tmp_path / "a" / name), runtime_of(tmp_path / "b" / name)
    assert len({ours, a, b}) == 3 and all(p.parent == private_base() for p in (a, b))
    assert len(str(a / "sock")) < 100  # a Unix socket's path is limited to 107 bytes


def test_a_checksums_folder_that_cannot_be_written_is_said_before_any_work(engines, tmp_path):  # noqa: F811
    from unibake.errors import UnibakeError

    from .test_supply_chain import release

    (tmp_path / "checksums").write_text("a file where the record's folder goes\n")
    with pytest.raises(UnibakeError, match=r"cannot write the checksums record folder .*checksums"):
        release(engines, tmp_path / "release")
    assert engines["fake://verify"].loads == 0 and not (tmp_path / "release" / "1.0").exists()


def test_another_products_release_of_the_same_tag_does_not_replace_its_checksums_record(engines, tmp_path):  # noqa: F811
    # release/a and release/b (each product its own --out, as the tool advises) share release/checksums/:
    # product b's 1.0 replaced product a's record without a word
    from .test_supply_chain import release

    release(engines, tmp_path / "a")
    record = tmp_path / "checksums/1.0.SHA256SUMS"
    kept = record.read_text()
    assert kept == (tmp_path / "a/1.0/SHA256SUMS").read_text()
    with pytest.raises(InputError, match=rf"{record} is the record of another product's release 1.0 \(its archive "
                                         r"'demo-1.0.tar.zst', not 'other-1.0.tar.zst'\): every --out beside "):
        release(engines, tmp_path / "b", product="other")
    assert record.read_text() == kept and not (tmp_path / "b/1.0").exists()
    assert engines["fake://verify"].loads == 1  # refused before any work
    release(engines, tmp_path / "again")  # the same product's 1.0 made again elsewhere: as before
    release(engines, tmp_path / "b", product="other", force=True)  # --force replaces it, as asked
    assert record.read_text() == (tmp_path / "b/1.0/SHA256SUMS").read_text()


def test_another_products_record_written_while_a_run_built_is_not_replaced_by_its_commit(engines, tmp_path,  # noqa: F811
                                                                                          monkeypatch):
    # found by review: two products' runs of 1.0 at once (release/a, release/b, a CI matrix) both passed the check
    # made before their builds; the later commit replaced the other's record without a word. The record is checked
    # again under a lock on it, as the release takes its name.
    from unibake import pipeline

    from .test_supply_chain import release

    release(engines, tmp_path / "a")
    record = tmp_path / "checksums/1.0.SHA256SUMS"
    kept = record.read_text()
    record.unlink()  # b's run begins with no record there: its early check passes
    published = pipeline.publish

    def a_commits_meanwhile(*args, **kwargs):
        record.write_text(kept)  # a's run committed while b's built
        return published(*args, **kwargs)

    monkeypatch.setattr(pipeline, "publish", a_commits_meanwhile)
    with pytest.raises(InputError, match=rf"{record} is the record of another product's release 1\.0 .*; nothing was "
                                         "published$"):
        release(engines, tmp_path / "b", product="other")
    assert record.read_text() == kept and not (tmp_path / "b/1.0").exists()
    assert sorted(p.name for p in record.parent.iterdir()) == ["1.0.SHA256SUMS"]  # (no temporary record)

def test_a_fifo_planted_as_the_checksums_record_is_not_waited_on(engines, tmp_path):  # noqa: F811
    # (before: the check for another product's record opened it to read and waited for a writer for ever)
    import threading

    from .test_supply_chain import release

    record = tmp_path / "checksums" / "1.0.SHA256SUMS"
    record.parent.mkdir()
    os.mkfifo(record)
    done = []
    run = threading.Thread(target=lambda: done.append(release(engines, tmp_path / "release")), daemon=True)
    run.start()
    run.join(60)
    if run.is_alive():  # let it go: a writer that closes at once
        os.close(os.open(record, os.O_WRONLY | os.O_NONBLOCK))
        run.join(60)
        pytest.fail("the run waited on the FIFO")
    assert done and record.read_text() == (tmp_path / "release" / "1.0" / "SHA256SUMS").read_text()


def test_releases_with_an_out_that_does_not_exist_and_rebuild_of_a_release_folder_are_bad_input(cli, tmp_path):
    typo = cli("releases", "--out", str(tmp_path / "relase"))
    assert typo.code == 2 and typo.error_lines == [f"error: --out {tmp_path / 'relase'}: no such folder"]
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release")
    wrong = cli("rebuild", str(folder))
    assert wrong.code == 2 and "a release folder, not a kit: write its kit with `build.py kit" in wrong.error_lines[-1]


@pytest.mark.parametrize("where", ["out", "out/inner"])
def test_an_out_that_is_a_file_is_bad_input_before_anything_is_built(engines, tmp_path, where):  # noqa: F811
    from .test_supply_chain import release

    (tmp_path / "out").write_text("a file\n")
    with pytest.raises(InputError, match=rf"--out {tmp_path / where}: not a folder \(a file of that name, or above "
                                         r"it, exists\)"):
        release(engines, tmp_path / where)
    assert (tmp_path / "out").read_text() == "a file\n"


def test_a_full_disk_while_the_kit_is_written_names_the_folder(tmp_path):
    # the kit's draft (its thread writes the context tar) fails as a full disk does: the stage names
    # the staging folder and the kit, as the archive's disk errors do (it was "error: a file: ...")
    import errno
    from contextlib import ExitStack
    from types import SimpleNamespace

    from unibake.errors import DiskFull
    from unibake.pipeline import Request, Run
    from unibake.supply import kit_stage

    from .test_supply_chain import Quiet

    class FullDraft:
        epoch = 0

        def finish(self, **kw):
            raise OSError(errno.ENOSPC, "No space left on device")

    run = Run(Request(env={}, cwd=tmp_path), Quiet(), ExitStack(), connect=lambda address: None)
    run.results.update(target=SimpleNamespace(product="demo", release="1.0"),
                       image=SimpleNamespace(labels={"io.unibake.source-date-epoch": "0"}, image_id="sha256:" + "1" * 64,
                                             diff_ids=()),
                       sbom=SimpleNamespace(base=object(), builder=None, toolchains=()), plan=object(),
                       folder=SimpleNamespace(staging=tmp_path / ".1.0.partial"), kit_draft=FullDraft())
    with pytest.raises(DiskFull, match=r"no space left in .*\.1\.0\.partial while writing the reconstruct kit "
                                       r"demo-1\.0-kit\.tar\.zst; nothing was published"):
        kit_stage(run)


def _two_platforms(tmp_path, fail_on: str | None = None, force=True, built=None):
    """run_platforms over two platforms with a folder stage and a publish stage (each writes its
    release in its staging folder and commits it; the one for ``fail_on`` fails as a full disk does)."""
    from unibake.errors import DiskFull
    from unibake.pipeline import Request, Stage
    from unibake.platforms import KNOWN
    from unibake.targets import run_platforms

    from .test_publish import publish_into
    from .test_supply_chain import Quiet

    def folder_stage(run):
        tag = "1.0" + KNOWN[run.request.platform].suffix
        return (run.stack.enter_context(ReleaseFolder(run.request.out, tag, force=run.request.force)),)

    def publish_stage(run):
        folder = run["folder"]
        (folder.staging / "manifest.json").write_text(f"new {folder.tag}\n")
        if run.request.platform == fail_on:
            raise DiskFull(f"no space left in {folder.staging} while writing release {folder.tag}; nothing was "
                           "published")
        return (publish_into(folder, tmp_path / "checksums"),)

    def build_stage(run):
        (built if built is not None else []).append(run.request.platform)
        return ("an image",)

    stages = [Stage(name="folder", about="", needs=("request",), gives=("folder",), run=folder_stage),
              Stage(name="build", about="", needs=("folder",), gives=("image",), run=build_stage),
              Stage(name="publish", about="", needs=("folder", "image"), gives=("release",), run=publish_stage)]
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", force=force)
    return run_platforms(stages, request, [KNOWN["linux/amd64"], KNOWN["linux/arm64"]], Quiet(),
                         connect=lambda address: None)


def test_a_release_for_several_platforms_is_published_whole_or_not_at_all(tmp_path):
    """A build for two platforms wrote and committed each platform's folder in turn: a failure while
    the second was written (a full disk, a signature that failed, an interrupt) left the first one
    published, replacing its old release, and the second not. Now both are written first, then renamed
    together: the first is not published either, and both old releases stay as they were."""
    from unibake import publish
    from unibake.errors import DiskFull

    out = tmp_path / "release"
    for tag in ("1.0", "1.0-arm64"):
        (out / tag).mkdir(parents=True)
        (out / tag / "manifest.json").write_text(f"old {tag}\n")
    publish.COMMITTED.clear()
    with pytest.raises(DiskFull, match="while writing release 1.0-arm64"):
        _two_platforms(tmp_path, fail_on="linux/arm64")
    assert {p.name: (p / "manifest.json").read_text() for p in out.iterdir() if not p.name.endswith(".lock")} == {
        "1.0": "old 1.0\n", "1.0-arm64": "old 1.0-arm64\n"}  # no staging, no .old left behind
    assert publish.COMMITTED == [] and os.listdir(tmp_path / "checksums") == []  # no record, no temporary one

    published = _two_platforms(tmp_path)
    assert [r["release"] for r in published] == [out / "1.0", out / "1.0-arm64"]
    assert [json.loads((out / tag / "manifest.json").read_text())["release"] for tag in ("1.0", "1.0-arm64")] == \
        ["1.0", "1.0-arm64"]
    assert sorted(os.listdir(tmp_path / "checksums")) == ["1.0-arm64.SHA256SUMS", "1.0.SHA256SUMS"]
    assert publish.COMMITTED == [out / "1.0", out / "1.0-arm64"]
    publish.COMMITTED.clear()


def test_a_rename_that_fails_in_a_group_commit_puts_back_the_ones_renamed_before_it(tmp_path, monkeypatch):
    from unibake import publish

    out = tmp_path / "release"
    for tag in ("1.0", "1.0-arm64"):
        (out / tag).mkdir(parents=True)
        (out / tag / "manifest.json").write_text(f"old {tag}\n")
    real = os.replace

    def replace(src, dst):
        if str(src).endswith(".1.0-arm64.partial"):
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(publish.os, "replace", replace)
    group = publish.CommitGroup()
    with pytest.raises(OSError):
        with ReleaseFolder(out, "1.0", force=True) as a, ReleaseFolder(out, "1.0-arm64", force=True) as b:
            for folder in (a, b):
                folder.group = group
                (folder.staging / "manifest.json").write_text(f"new {folder.tag}\n")
                folder.commit()
            assert not a.committed and (out / "1.0/manifest.json").read_text() == "old 1.0\n"  # (only joined)
            group.commit()
    assert not a.committed and not b.committed
    assert {p.name: (p / "manifest.json").read_text() for p in out.iterdir() if not p.name.endswith(".lock")} == {
        "1.0": "old 1.0\n", "1.0-arm64": "old 1.0-arm64\n"}


def test_an_interrupt_during_a_group_commit_lands_after_every_folder_is_published(tmp_path, monkeypatch):
    from unibake import publish

    out = tmp_path / "release"
    real = os.replace
    renamed = []

    def replace_then_signal(src, dst):
        real(src, dst)
        if str(src).endswith(".partial"):
            renamed.append(dst)
        if len(renamed) == 1 and str(src).endswith(".partial"):  # the first platform's folder in place, not the second
            os.kill(os.getpid(), signal.SIGTERM)

    publish.COMMITTED.clear()
    monkeypatch.setattr(publish.os, "replace", replace_then_signal)
    try:
        with terminated_as_the_cli():
            with pytest.raises(KeyboardInterrupt):
                _two_platforms(tmp_path)
            assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == ["1.0", "1.0-arm64"]
            assert publish.COMMITTED == [out / "1.0", out / "1.0-arm64"]
    finally:
        publish.COMMITTED.clear()


def test_an_interrupt_after_several_platforms_are_published_names_them_all(cli, tmp_path, monkeypatch):
    # "interrupted after A, B was published whole (check it: python build.py verify A)": the second not
    # to be checked, in words that read as if one was published
    def publish_then_interrupted(args, ctx):
        _two_platforms(tmp_path)
        raise KeyboardInterrupt

    monkeypatch.setitem(cli_module.HANDLERS, "releases", publish_then_interrupted)
    result = cli("releases")
    a, b = tmp_path / "release/1.0", tmp_path / "release/1.0-arm64"
    assert result.code == 130 and result.error_lines == [
        f"error: interrupted after {a} and {b} were published whole (check them: python build.py verify {a}; "
        f"python build.py verify {b})"]


def test_a_platform_whose_release_exists_is_refused_before_any_platform_is_built(tmp_path):
    """``--platform linux/amd64,linux/arm64`` without --force where release 1.0-arm64 exists: amd64 was
    built, archived, round-tripped and gated (minutes) before arm64's folder stage said it exists. Now
    every platform's plan and release folder come first: refused before anything is built."""
    (tmp_path / "release/1.0-arm64").mkdir(parents=True)
    built = []
    with pytest.raises(InputError, match="release .*1.0-arm64 already exists; use --force"):
        _two_platforms(tmp_path, force=False, built=built)
    assert built == []
    assert sorted(os.listdir(tmp_path / "release")) == [".1.0-arm64.lock", ".1.0.lock", "1.0-arm64"]


def test_a_checksums_record_that_cannot_be_put_in_place_in_a_group_commit_stops_no_other(tmp_path):
    # (before: the first platform's failed rename left the second's record as .1.0-arm64.SHA256SUMS.tmp)
    from unibake import publish
    from unibake.errors import UnibakeError

    (tmp_path / "checksums" / "1.0.SHA256SUMS").mkdir(parents=True)  # a folder where 1.0's record goes
    (tmp_path / "checksums" / "1.0.SHA256SUMS" / "x").write_text("")
    publish.COMMITTED.clear()
    try:
        with pytest.raises(UnibakeError) as caught:
            _two_platforms(tmp_path)
        assert str(tmp_path / "checksums" / "1.0.SHA256SUMS") in str(caught.value)
        assert "1.0-arm64" not in str(caught.value).replace(str(tmp_path / "release"), "")
        assert sorted(os.listdir(tmp_path / "checksums")) == ["1.0-arm64.SHA256SUMS", "1.0.SHA256SUMS"]
        assert (tmp_path / "checksums" / "1.0-arm64.SHA256SUMS").read_text() == \
            (tmp_path / "release" / "1.0-arm64" / "SHA256SUMS").read_text()
        assert publish.COMMITTED == [tmp_path / "release" / "1.0", tmp_path / "release" / "1.0-arm64"]
    finally:
        publish.COMMITTED.clear()


def test_a_record_written_while_a_group_of_platforms_published_is_checked_again_as_the_group_commits(tmp_path,
                                                                                                     monkeypatch):
    # found by review: a folder of a group only joins it at publish; the check ran then, and the group's renames
    # and records came later, unchecked: another product's record written meanwhile was replaced
    from unibake import publish
    from unibake.errors import InputError

    from . import test_publish

    record = tmp_path / "checksums" / "1.0.SHA256SUMS"
    real = publish.publish

    def refuse_another(path):
        if path.exists() and "other-1.0.tar.zst" in path.read_text():
            raise InputError(f"{path} is the record of another product's release 1.0; nothing was published")

    def with_the_check(folder, *args, **kwargs):
        if folder.tag == "1.0-arm64":  # as the second platform publishes, another product's run commits 1.0
            record.parent.mkdir(exist_ok=True)
            record.write_text(f"{'0' * 64}  other-1.0.tar.zst\n")
        return real(folder, *args, check_record=refuse_another, **kwargs)

    monkeypatch.setattr(test_publish, "publish", with_the_check)
    publish.COMMITTED.clear()
    try:
        with pytest.raises(InputError, match="is the record of another product's release 1.0"):
            _two_platforms(tmp_path)
        assert publish.COMMITTED == []
    finally:
        publish.COMMITTED.clear()
    assert record.read_text() == f"{'0' * 64}  other-1.0.tar.zst\n"  # kept
    assert sorted(os.listdir(tmp_path / "checksums")) == ["1.0.SHA256SUMS"]  # no temporary record left
    assert not (tmp_path / "release" / "1.0").exists() and not (tmp_path / "release" / "1.0-arm64").exists()

def test_a_group_commit_whose_undo_fails_names_the_folder_it_left_published(tmp_path, monkeypatch):
    # (before: the error named only the rename that failed, as if nothing was published, while 1.0 was)
    from unibake import publish
    from unibake.errors import UnibakeError

    out = tmp_path / "release"
    real = os.replace

    def replace(src, dst):
        if str(src).endswith(".1.0-arm64.partial") or str(dst).endswith(".1.0.partial"):
            raise OSError(5, "Input/output error", str(src))
        real(src, dst)

    monkeypatch.setattr(publish.os, "replace", replace)
    publish.COMMITTED.clear()
    group = publish.CommitGroup()
    try:
        with pytest.raises(UnibakeError, match=rf"cannot publish {out / '.1.0-arm64.partial'} \(Input/output error\); "
                                               rf"{out / '1.0'} \(Input/output error\) took its place and could not be "
                                               "put back"):
            with ReleaseFolder(out, "1.0", force=True) as a, ReleaseFolder(out, "1.0-arm64", force=True) as b:
                for folder in (a, b):
                    folder.group = group
                    (folder.staging / "manifest.json").write_text(f"new {folder.tag}\n")
                    folder.commit()
                group.commit()
        assert publish.COMMITTED == [out / "1.0"] and (out / "1.0" / "manifest.json").read_text() == "new 1.0\n"
    finally:
        publish.COMMITTED.clear()


def test_an_interrupt_during_a_gate_whose_clean_up_fails_ends_the_run_as_an_interrupt_with_a_warning(
        engines, tmp_path):  # noqa: F811
    # (before: the clean-up's "cannot remove container" replaced the interrupt: exit 1, not 130)
    from unibake.errors import EngineError
    from unibake.pipeline import ARCHIVE, Request, run_stages, selection

    from .test_supply_chain import Quiet

    verify = engines["fake://verify"]

    def interrupted(container):
        raise KeyboardInterrupt

    def remove_container(container):
        raise EngineError(f"cannot remove container {container[:12]}: the engine is shutting down")

    verify.container_status, verify.remove_container = interrupted, remove_container
    reporter = Quiet()
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", image="demo:1.0", verify_engine="fake://verify")
    with pytest.raises(KeyboardInterrupt):
        run_stages(selection(ARCHIVE), request, reporter, connect=engines.__getitem__)
    said = [line for line in reporter.stream.getvalue().splitlines() if line.startswith("warning: after the smoke")]
    assert len(said) == 1 and said[0].endswith(": the engine is shutting down"), reporter.stream.getvalue()
    assert not (tmp_path / "release" / "1.0").exists()


def test_an_interrupt_while_main_sets_up_is_one_error_line_and_130(cli, tmp_path, monkeypatch):
    # (before: the handlers were set before the try that turns an interrupt into "error: interrupted": a
    # signal while main imported the signing module or made its reporter ended in a traceback)
    from unibake.console import Reporter

    def interrupted_reporter(**kwargs):
        monkeypatch.setattr(cli_module, "Reporter", Reporter)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once, to main's own handler
        return Reporter(**kwargs)

    monkeypatch.setattr(cli_module, "Reporter", interrupted_reporter)
    document = tmp_path / "m.json"
    try:
        result = cli("--metadata-file", str(document), "releases", "--out", str(tmp_path))
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main() (a traceback)")
    assert result.code == 130 and result.err == "error: interrupted\n", result.err
    assert json.loads(document.read_text()) == {"error": "interrupted", "exit_code": 130}
    assert signal.getsignal(signal.SIGTERM) is not cli_module._terminate  # put back as it was


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_build_py_imports_unibake_is_one_error_line_and_130(tmp_path, sig):
    # (before: a Ctrl-C in the first second of `python build.py ...`, while unibake was imported, printed a
    # traceback; a SIGTERM then ended it silently with 143)
    import subprocess
    import sys

    from ..conftest import REPO

    hook = (f"import os, runpy, signal, sys\n"
            f"class Interrupt:\n"
            f"    def find_spec(self, name, path=None, target=None):\n"
            f"        if name == 'unibake.console':\n"
            f"            os.kill(os.getpid(), signal.{sig})\n"
            f"        return None\n"
            f"sys.meta_path.insert(0, Interrupt())\n"
            f"sys.argv = ['build.py', 'releases', '--out', {str(tmp_path)!r}]\n"
            f"runpy.run_path({str(REPO / 'build.py')!r}, run_name='__main__')\n")
    ran = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true"})
    assert (ran.returncode, ran.stderr) == (130, "error: interrupted\n")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_run_has_ended_leaves_its_result_and_exit_code(tmp_path, sig):
    # (before: a Ctrl-C between main()'s end and the process's exit printed a KeyboardInterrupt traceback; a
    # SIGTERM there turned the run's exit code into 143)
    import subprocess
    import sys

    from ..conftest import REPO

    hook = (f"import os, runpy, signal, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"import unibake.cli\n"
            f"real = unibake.cli.main\n"
            f"def main(*args, **kwargs):\n"
            f"    code = real(*args, **kwargs)\n"
            f"    os.kill(os.getpid(), signal.{sig})\n"
            f"    return code\n"
            f"unibake.cli.main = main\n"
            f"sys.argv = ['build.py', 'verify', {str(tmp_path / 'absent')!r}]\n"
            f"runpy.run_path({str(REPO / 'build.py')!r}, run_name='__main__')\n")
    ran = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true"})
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, (ran.returncode, ran.stderr)
    assert ran.stderr.count("error:") == 1, ran.stderr


def test_a_metadata_file_the_full_disk_refuses_after_the_release_is_published_says_it_was_published(
        cli, tmp_path, monkeypatch):
    # (before: "error: --metadata-file m.json: cannot write (No space left on device)" alone, exit 1: the
    # release had just been published (often what filled the disk), and a rerun was refused as existing)
    import errno

    from unibake import files

    def publish(args, ctx):
        with ReleaseFolder(tmp_path / "release", "1.0", force=False) as folder:
            (folder.staging / "manifest.json").write_text("{}\n")
            folder.commit()
        return cli_module.Outcome(document={"release": "1.0"}, final="published 1.0")

    real = files.tempfile.mkstemp

    def full(*args, prefix="", **kwargs):  # the metadata file's temporary file (its own, as every atomic write's)
        if prefix.startswith(".m.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, prefix=prefix, **kwargs)

    monkeypatch.setitem(cli_module.HANDLERS, "releases", publish)
    monkeypatch.setattr(files.tempfile, "mkstemp", full)
    result = cli("--metadata-file", str(tmp_path / "m.json"), "releases")
    folder = tmp_path / "release" / "1.0"
    assert result.code == 1 and result.error_lines == [
        f"error: --metadata-file {tmp_path}/m.json: cannot write (No space left on device); {folder} was published "
        f"whole (check it: python build.py verify {folder})"], result.err
    assert sorted(os.listdir(tmp_path)) == ["release"]
    monkeypatch.setitem(cli_module.HANDLERS, "releases",
                        lambda args, ctx: cli_module.Outcome(document={}, final="pushed"))
    pushed = cli("--metadata-file", str(tmp_path / "m.json"), "releases")
    assert pushed.error_lines == [f"error: --metadata-file {tmp_path}/m.json: cannot write (No space left on device); "
                                  "the releases command itself succeeded (said above)"], pushed.err
    monkeypatch.setitem(cli_module.HANDLERS, "releases", lambda args, ctx: cli_module.Outcome(
        document={}, final="", error=cli_module.VerificationError("1.0 does not verify")))
    failed = cli("--metadata-file", str(tmp_path / "m.json"), "releases")
    assert failed.code == 3 and failed.error_lines == [
        f"error: --metadata-file {tmp_path}/m.json: cannot write (No space left on device); the releases command "
        "itself failed: 1.0 does not verify"], failed.err


ENTRY_POINTS = {  # what `python -m unibake` runs, and the script pip writes for the `unibake` command
    "python -m unibake": "runpy.run_module('unibake', run_name='__main__', alter_sys=True)\n",
    "unibake": "from unibake.__main__ import run\nsys.exit(run())\n"}


def _interrupted_at_import(sig: str, out) -> str:
    """The start of a child's script that sends itself ``sig`` as unibake.console is imported, to run
    ``releases --out OUT``; the entry point follows."""
    from ..conftest import REPO

    return (f"import os, runpy, signal, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"class Interrupt:\n"
            f"    def find_spec(self, name, path=None, target=None):\n"
            f"        if name == 'unibake.console':\n"
            f"            os.kill(os.getpid(), signal.{sig})\n"
            f"        return None\n"
            f"sys.meta_path.insert(0, Interrupt())\n"
            f"sys.argv = ['unibake', 'releases', '--out', {str(out)!r}]\n")


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_unibake_command_imports_is_one_error_line_and_130(tmp_path, sig, entry):
    # (before: build.py alone handled it: a Ctrl-C printed a traceback, a SIGTERM ended it with 143)
    import subprocess
    import sys

    hook = _interrupted_at_import(sig, tmp_path) + ENTRY_POINTS[entry]
    ran = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true"})
    assert (ran.returncode, ran.stderr) == (130, "error: interrupted\n")


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS) + ["build.py"])
def test_an_interrupt_while_importing_with_json_writes_the_failure_s_document(tmp_path, entry):
    # found by review: exit 130 and the error line, but stdout empty: a script reading --json got no document
    import subprocess
    import sys

    from ..conftest import REPO

    start = _interrupted_at_import("SIGINT", tmp_path).replace("['unibake', 'releases',",
                                                                "['unibake', '--json', 'releases',")
    run = f"runpy.run_path({str(REPO / 'build.py')!r}, run_name='__main__')\n" if entry == "build.py" \
        else ENTRY_POINTS[entry]
    ran = subprocess.run([sys.executable, "-c", start + run], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true"})
    assert (ran.returncode, ran.stderr) == (130, "error: interrupted\n")
    assert json.loads(ran.stdout) == {"error": "interrupted", "exit_code": 130}

@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("signals", [["SIGTERM"], ["SIGTERM", "SIGTERM", "SIGTERM"], ["SIGINT"]])
def test_signals_once_the_unibake_command_has_ended_leave_its_exit_code(tmp_path, signals, entry):
    # (before: with python -m unibake or the unibake command, a SIGTERM (a supervisor's second or third, after
    # the clean-up) between main()'s end and the exit turned the run's exit code into 143)
    import subprocess
    import sys

    from ..conftest import REPO

    kills = "".join(f"    os.kill(os.getpid(), signal.{sig})\n" for sig in signals)
    hook = (f"import os, runpy, signal, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"import unibake.cli\n"
            f"real = unibake.cli.main\n"
            f"def main(*args, **kwargs):\n"
            f"    code = real(*args, **kwargs)\n"
            f"{kills}"
            f"    return code\n"
            f"unibake.cli.main = main\n"
            f"sys.argv = ['unibake', 'verify', {str(tmp_path / 'absent')!r}]\n" + ENTRY_POINTS[entry])
    ran = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true"})
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, (ran.returncode, ran.stderr)
    assert ran.stderr.count("error:") == 1, ran.stderr


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS) + ["build.py"])
def test_an_interrupt_while_importing_with_stderr_closed_is_still_130(tmp_path, entry):
    # 2>&-: nowhere to say it, the exit code still does (before: build.py's 'error: interrupted' failed on the
    # missing stderr, exit 1)
    import subprocess
    import sys

    from ..conftest import REPO

    start = f"runpy.run_path({str(REPO / 'build.py')!r}, run_name='__main__')\n" if entry == "build.py" else \
        ENTRY_POINTS[entry]
    hook = _interrupted_at_import("SIGTERM", tmp_path) + start
    ran = subprocess.run([sys.executable, "-c", hook], stdout=subprocess.PIPE, text=True, timeout=60,
                         env={**os.environ, "CI": "true"}, preexec_fn=lambda: os.close(2))
    assert ran.returncode == 130


def test_an_interrupt_as_the_staging_folder_is_made_leaves_no_staging_folder(tmp_path, monkeypatch):
    # (before: the lock was let go, and the empty .TAG.partial left until the next run of that tag removed it)
    from unibake import publish

    real = publish.fresh_folder

    def made_then_interrupted(path, what, **kwargs):
        real(path, what, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the folder is there; the signal lands as it is returned

    out = tmp_path / "release"
    monkeypatch.setattr(publish, "fresh_folder", made_then_interrupted)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            with ReleaseFolder(out, "1.0", force=False):
                pass
    assert sorted(os.listdir(out)) == [".1.0.lock"]
    monkeypatch.setattr(publish, "fresh_folder", real)
    with ReleaseFolder(out, "1.0", force=False):  # the lock was let go
        pass


def test_an_interrupt_as_the_release_folder_stage_returns_from_its_enter_leaves_no_staging_folder(
        engines, tmp_path, monkeypatch):  # noqa: F811
    # entered with ExitStack.enter_context, the release folder's exit was recorded only once its enter had returned:
    # an interrupt in between (locked and staged, the exit not yet recorded) left .TAG.partial behind
    from unibake import pipeline
    from unibake.pipeline import Request, run_stages, selection

    from .test_supply_chain import Quiet

    class InterruptedAsItReturns(ReleaseFolder):
        def __enter__(self):
            entered = super().__enter__()
            os.kill(os.getpid(), signal.SIGTERM)  # locked and staged; the signal lands as the enter returns
            return entered

    monkeypatch.setattr(pipeline, "ReleaseFolder", InterruptedAsItReturns)
    out = tmp_path / "release"
    request = Request(env={}, cwd=tmp_path, out=out, image="demo:1.0", verify_engine="fake://verify")
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            run_stages(selection(("inspect", "scan inspected", "folder")), request, Quiet(),
                       connect=engines.__getitem__)
    assert sorted(os.listdir(out)) == [".1.0.lock"]
    with ReleaseFolder(out, "1.0", force=False):  # the lock was let go
        pass


def test_an_interrupt_as_the_build_ends_puts_the_release_tag_back(busybox_product, tmp_path):
    # the tag's clean-up was pushed once build_image had returned: an interrupt as the build ended (the engine's tag
    # set, build_image's last look at it under way) left the release's tag on an image never released, for good
    from unibake.pipeline import BUILD, Request, run_stages, selection

    from .test_buildmemo import BuildingEngine
    from .test_supply_chain import Quiet

    class InterruptedAsTheBuildEnds(BuildingEngine):
        built = False

        def build(self, *args, **kwargs):
            outcome = super().build(*args, **kwargs)
            self.built = True
            return outcome

        def inspect_image(self, ref):
            if self.built and ref == "unibake-test:0.1.0":  # build_image's last look at the tag it set
                self.built = False
                os.kill(os.getpid(), signal.SIGTERM)
            return super().inspect_image(ref)

    engine = InterruptedAsTheBuildEnds()
    engine.add({"architecture": "amd64", "os": "linux"}, [b"base"], tag="localhost/unibake-busybox:1")
    before = engine.add({"architecture": "amd64", "os": "linux", "before": 1}, [b"before"], tag="unibake-test:0.1.0")
    request = Request(env={}, cwd=tmp_path, config=busybox_product, out=tmp_path / "release", require_lock=False,
                      write_rendered=False)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            run_stages(selection(BUILD, stop_after="build"), request, Quiet(), connect=lambda address: engine)
    assert engine.tags["unibake-test:0.1.0"] == before
    failed = [ref for ref in engine.tags if ref.endswith("-failed")]
    assert len(failed) == 1 and engine.tags[failed[0]] != before  # the build kept as build cache, named


@pytest.mark.parametrize("failure", ["an engine error", "a file error"])
def test_an_error_after_the_commit_says_the_release_was_published(cli, tmp_path, monkeypatch, failure):
    # found by review: a clean-up that failed after the release was published whole (the scratch engine's stop,
    # raised as the run ends) was "error: ..." and exit 1, as if nothing had been published
    from unibake.errors import EngineError

    def publish_then_fail(args, ctx):
        with ReleaseFolder(tmp_path / "release", "1.0", force=False) as folder:
            (folder.staging / "manifest.json").write_text("{}\n")
            folder.commit()
        if failure == "an engine error":
            raise EngineError("cannot stop the scratch engine")
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setitem(cli_module.HANDLERS, "releases", publish_then_fail)
    result = cli("releases")
    folder = tmp_path / "release" / "1.0"
    said = "cannot stop the scratch engine" if failure == "an engine error" else "a file: No such process"
    assert result.code == 1 and result.error_lines == [
        f"error: {said} after {folder} was published whole (check it: python build.py verify {folder})"], result.err
