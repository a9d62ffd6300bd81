"""Sources must stay inside the project, and a build must match inputs.lock."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.platforms import host

from ..conftest import as_nobody


def set_tune_source(profiles, value: str) -> None:
    path = profiles / "tp1.yaml"
    path.write_text(path.read_text().replace("source: images/tune/tp1", f"source: {value}"))


@pytest.mark.parametrize("source", ["../outside", "/etc", "images/../../outside", "images/tune/../../.."])
def test_a_source_outside_the_project_is_refused(busybox_product, source):
    set_tune_source(busybox_product, f'"{source}"')
    with pytest.raises(InputError, match=r"tp1\.yaml:\d+: key 'tune_caches.source' has an invalid value .*"
                                         r"a relative path inside the repository"):
        make_plan(busybox_product, verify_lock=False)


def test_a_source_folder_named_with_a_space_is_refused_saying_why(busybox_product):
    # it is a relative path inside the repository: the message says what is wrong with it
    (busybox_product.parent / "images/tune/tp one").mkdir()
    set_tune_source(busybox_product, '"images/tune/tp one"')
    with pytest.raises(InputError, match=r"tp1\.yaml:\d+: key 'tune_caches.source' has an invalid value "
                                         r"'images/tune/tp one': .*\(no spaces, no '\.' or '\.\.' parts\)$"):
        make_plan(busybox_product, verify_lock=False)


def test_a_symlinked_source_that_points_out_is_refused(busybox_product, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.json").write_text("{}")
    (busybox_product.parent / "images/tune/escape").symlink_to(outside)
    set_tune_source(busybox_product, "images/tune/escape")
    with pytest.raises(InputError, match=r"source 'images/tune/escape' resolves outside the project"):
        make_plan(busybox_product, verify_lock=False)


def test_a_symlinked_file_that_points_out_is_refused(busybox_product, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    os.symlink(secret, busybox_product.parent / "images/tune/tp1/cache-3.json")
    with pytest.raises(InputError, match=r"'images/tune/tp1/cache-3\.json' is a symlink that points outside"):
        make_plan(busybox_product, verify_lock=False)


def test_a_missing_source_is_named(busybox_product):
    set_tune_source(busybox_product, "images/tune/tp7")
    with pytest.raises(InputError, match=r"tp1\.yaml:\d+: source 'images/tune/tp7' does not exist"):
        make_plan(busybox_product, verify_lock=False)


def test_an_input_that_differs_from_the_lock_is_named(busybox_product):
    (busybox_product.parent / "images/tune/tp2/cache-2.json").write_text('{"tp2_cache": "edited"}\n')
    with pytest.raises(InputError, match=r"input 'images/tune/tp2/cache-2\.json' differs from "
                                         r".*inputs\.lock \(locked [0-9a-f]{12}, now [0-9a-f]{12}\); "
                                         r"review the change, then run: python build.py lock --config "
                                         r"\S*/product/profiles$"):  # the lock of this product, not ./profiles
        make_plan(busybox_product)
    with pytest.raises(InputError, match=r"then run: python build.py lock$"):  # from the product: the default
        make_plan(busybox_product, cwd=busybox_product.parent)


def test_a_new_input_must_be_locked(busybox_product):
    (busybox_product.parent / "images/engine/extra.sh").write_text("echo extra\n")
    with pytest.raises(InputError, match=r"input 'images/engine/extra\.sh' is not in .*inputs\.lock"):
        make_plan(busybox_product)


def test_a_missing_lock_is_refused(busybox_product):
    (busybox_product / "inputs.lock").unlink()
    with pytest.raises(InputError, match=r"inputs\.lock: the inputs lock is missing; create it with: "
                                         r"python build.py lock"):
        make_plan(busybox_product)


def test_lock_command_rewrites_the_lock_and_then_the_build_accepts(busybox_product, cli):
    changed = busybox_product.parent / "images/tune/tp2/cache-2.json"
    changed.write_text('{"tp2_cache": "edited"}\n')
    refused = cli("--stage", "render", "--config", str(busybox_product))
    assert refused.code == 2
    assert refused.error_lines == [refused.err.strip().splitlines()[-1]]
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0
    assert "changed: images/tune/tp2/cache-2.json" in locked.err  # human output goes to stderr
    assert cli("--stage", "render", "--config", str(busybox_product)).code == 0
    lines = (busybox_product / "inputs.lock").read_text().splitlines()
    entries = [line[66:] for line in lines if not line.startswith("#")]  # after 'HASH  ' or 'HASH *'
    assert entries == sorted(entries) and "images/tune/tp2/cache-2.json" in entries



@pytest.mark.parametrize("how", ["the profiles folder as an overlay", "a link to it in the engine"])
def test_a_source_that_bakes_the_lock_itself_is_refused_by_lock_and_build(busybox_product, cli, how):
    # each lock changed the lock's own sha256, so every build said "differs from inputs.lock ... run: python
    # build.py lock", for ever
    holder = "profiles" if how.startswith("the profiles") else "images/engine"
    if holder == "profiles":
        product = busybox_product / "product.yaml"
        product.write_text(product.read_text() + "overlays: [{source: profiles, target: conf/}]\n")
    else:
        (busybox_product.parent / "images/engine/inputs.lock").symlink_to("../../profiles/inputs.lock")
    lock = (busybox_product / "inputs.lock").read_bytes()
    for argv in (["lock"], ["--stage", "render"]):
        result = cli(*argv, "--config", str(busybox_product))
        assert result.code == 2, result.err
        assert result.error_lines == [f"error: {busybox_product / 'inputs.lock'}: the source '{holder}' bakes the inputs "
                                      "lock into the image, but the lock cannot pin its own sha256 (each build.py lock "
                                      "would change it again); bake the files beside it one by one instead"]
    assert (busybox_product / "inputs.lock").read_bytes() == lock


def test_the_lock_pins_which_inputs_are_executable_and_sha256sum_still_reads_it(busybox_product, cli):
    import subprocess

    lock_file = busybox_product / "inputs.lock"
    handle = busybox_product.parent / "images/engine/handle.sh"
    assert "  images/tune/tp1/cache-1.json\n" in lock_file.read_text()
    assert " *images/engine/handle.sh\n" in lock_file.read_text()  # baked executable
    checked = subprocess.run(["sha256sum", "--strict", "-c", str(lock_file)], cwd=busybox_product.parent,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    handle.chmod(0o644)  # the same bytes, another image: refused
    with pytest.raises(InputError, match=r"input 'images/engine/handle\.sh' differs from \S*inputs\.lock in its mode "
                                         r"\(locked executable, now not executable\); review the change"):
        make_plan(busybox_product)
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0 and "changed: images/engine/handle.sh" in locked.err
    assert "  images/engine/handle.sh\n" in lock_file.read_text()
    make_plan(busybox_product)
    (busybox_product.parent / "images/tune/tp1/cache-1.json").chmod(0o755)
    with pytest.raises(InputError,
                       match=r"'images/tune/tp1/cache-1\.json' .* \(locked not executable, now executable\)"):
        make_plan(busybox_product)


def test_a_lock_written_before_modes_were_locked_is_still_accepted(busybox_product):
    lock_file = busybox_product / "inputs.lock"
    from unibake.inputs import MODES_NOTE
    lock_file.write_text(lock_file.read_text().replace(MODES_NOTE + "\n", "").replace(" *", "  "))
    make_plan(busybox_product)  # its modes are not known, so not checked; its contents still are
    (busybox_product.parent / "images/engine/handle.sh").write_text("changed\n")
    with pytest.raises(InputError, match=r"input 'images/engine/handle\.sh' differs from"):
        make_plan(busybox_product)


def test_lock_writes_a_lock_it_cannot_read_anew_and_leaves_out_a_platform_the_product_does_not_build(
        busybox_product, cli):
    lock_file = busybox_product / "inputs.lock"
    good = lock_file.read_text()
    lock_file.write_text("<<<<<<< HEAD\n" + good + "=======\n" + good + ">>>>>>> feature\n")
    refused = cli("--stage", "render", "--config", str(busybox_product))
    assert refused.code == 2 and "not a 'sha256  name' line" in refused.error_lines[0]
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0, locked.err
    assert "the old lock cannot be read, so it is written anew" in locked.err
    assert lock_file.read_text() == good

    # its base pinned for amd64 as require_digest asks; arm64 cannot be planned: a product built for the
    # host's platform (none named) may be built on an arm64 host, which is said; one that names
    # linux/amd64 only is not built for arm64, and the warning on its every lock was noise
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        'base: {image: "localhost/unibake-busybox:1"}',
        'base: {image: "localhost/unibake-busybox:1", require_digest: true, platforms: '
        '{linux/amd64: "registry.example/busybox@sha256:' + "a" * 64 + '"}}'))
    if host().name == "linux/amd64":  # (on an arm64 host, the platform it builds)
        locked = cli("lock", "--config", str(busybox_product))
        assert locked.code == 0, locked.err
        assert "linux/arm64 is not locked" in locked.err and lock_file.read_text() == good
    product.write_text(product.read_text().replace("base:", "platform: linux/amd64\nbase:"))
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0 and "warning" not in locked.err and lock_file.read_text() == good, locked.err

def test_lock_names_the_lock_even_when_it_is_a_symlink(busybox_product, cli):
    lock_file = busybox_product / "inputs.lock"
    lock_file.rename(busybox_product / "current.lock")
    lock_file.symlink_to("current.lock")
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0, locked.err
    assert locked.err.strip().splitlines()[-1].startswith(f"{lock_file}: 7 inputs")  # not current.lock's name
    # found by probing: the link was replaced by a file, and the file it named (a team's locks/ folder) left stale
    assert lock_file.is_symlink() and os.readlink(lock_file) == "current.lock"
    assert len((busybox_product / "current.lock").read_text().split("\n")) > 7

    lock_file.unlink()
    lock_file.symlink_to("inputs.lock")  # a loop: named, exit 2, never a traceback
    refused = cli("lock", "--config", str(busybox_product))
    assert refused.code == 2 and refused.error_lines == [f"error: {lock_file}: a symlink loop; point it at a file"]


@pytest.mark.parametrize("target", ["tp1.yaml", "product.yaml", "notes.txt"])
def test_lock_writes_nothing_through_a_link_to_a_file_that_is_not_a_lock(busybox_product, cli, target):
    # found by probing: inputs.lock linked to tp1.yaml: "the old lock cannot be read, so it is written anew", and the
    # lock was written over the profile, exit 0
    lock_file = busybox_product / "inputs.lock"
    lock_file.rename(busybox_product.parent / "saved.lock")
    if target == "notes.txt":
        (busybox_product / target).write_text("a team's notes\n")
    before = (busybox_product / target).read_bytes()
    lock_file.symlink_to(target)
    refused = cli("lock", "--config", str(busybox_product))
    assert refused.code == 2 and refused.error_lines == [
        f"error: {lock_file}: a symlink to {busybox_product / target}, which is not a lock (it does not read as one); "
        "nothing written: remove the link, then run build.py lock again"], refused.err
    assert (busybox_product / target).read_bytes() == before and lock_file.is_symlink()


def test_lock_keeps_the_lock_file_s_own_mode(busybox_product, cli):
    # found by probing: a lock a team keeps read-only (0444) was made 0644 again by every `lock` run, without a word
    lock_file = busybox_product / "inputs.lock"
    lock_file.chmod(0o444)
    (busybox_product.parent / "images/engine/new.txt").write_text("one more input\n")
    locked = cli("lock", "--config", str(busybox_product))
    assert locked.code == 0 and "new.txt" in lock_file.read_text(), locked.err
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o444
    lock_file.unlink()  # and a new one is 0644
    assert cli("lock", "--config", str(busybox_product)).code == 0
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o644


def test_pycache_is_never_baked(busybox_product):
    cache = busybox_product.parent / "images/engine/__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    (busybox_product.parent / "images/engine/y.pyc").write_bytes(b"\0")
    plan = make_plan(busybox_product)  # the lock knows nothing of them, and need not
    assert not [f for f in plan.inputs if f.path.endswith(".pyc")]


def test_a_submodules_git_file_in_a_folder_source_is_baked_as_any_file(busybox_product):
    # a vendored kernel repository checked out as a git submodule holds a file .git ('gitdir: ...'), no folder: it
    # was refused as 'a symlink into a .git folder', which it is not
    sub = busybox_product.parent / "images/engine/kernels"
    sub.mkdir()
    (sub / ".git").write_text("gitdir: ../../../.git/modules/kernels\n")
    (sub / "README").write_text("kernels\n")
    plan = make_plan(busybox_product, verify_lock=False)
    assert {"images/engine/kernels/.git", "images/engine/kernels/README"} <= {f.path for f in plan.inputs}


def test_empty_folders_in_a_source_are_named_in_one_warning(busybox_product, cli):
    engine = busybox_product.parent / "images/engine"
    for folder in ("cache/a", "logs", "only-bytecode/__pycache__"):
        (engine / folder).mkdir(parents=True)
    (engine / "only-bytecode/x.pyc").write_bytes(b"\0")
    assert make_plan(busybox_product).warnings == (
        "images/engine: 3 empty folders ('cache/a', 'logs', 'only-bytecode') not in the image, which gets files only; "
        "put a file in one the engine needs",)
    result = cli("--stage", "render", "--config", str(busybox_product))
    assert result.code == 0, result.err
    assert [line for line in result.err.splitlines() if "empty folder" in line] == [
        "warning: images/engine: 3 empty folders ('cache/a', 'logs', 'only-bytecode') not in the image, which gets "
        "files only; put a file in one the engine needs"]


@pytest.mark.skipif(os.geteuid() != 0, reason="reads the product as another user, as root can")
def test_a_folder_or_file_of_a_source_this_user_cannot_read_is_refused_naming_it():
    # os.walk's default skipped a folder it could not list: its files were left out of the lock and the
    # image without a word; a file it could not read was exit 1 naming only its path
    import shutil
    import tempfile
    from pathlib import Path

    from ..conftest import BUSYBOX_PRODUCT, copy_product

    shared = Path(tempfile.mkdtemp(prefix="unibake-unreadable-"))
    try:
        shared.chmod(0o755)
        profiles = copy_product(BUSYBOX_PRODUCT, shared / "product")
        engine = profiles.parent / "images/engine"
        (engine / "lib").mkdir()
        (engine / "lib/part.sh").write_text("echo part\n")
        (engine / "lib").chmod(0o700)
        said = as_nobody(lambda: [f.path for f in make_plan(profiles, verify_lock=False, cwd=profiles.parent).engine.source.files])
        assert said == ("InputError: profiles/product.yaml:9: cannot read the folder 'images/engine/lib' (Permission "
                        "denied); every file of a source is baked: make it readable, or move it out of the source"), said
        (engine / "lib").chmod(0o755)
        (engine / "lib/part.sh").chmod(0o600)
        said = as_nobody(lambda: [f.path for f in make_plan(profiles, verify_lock=False, cwd=profiles.parent).engine.source.files])
        assert said == ("InputError: profiles/product.yaml:9: cannot read 'images/engine/lib/part.sh' (Permission "
                        "denied); make it readable to this user, or move it out of the source"), said
        (engine / "lib/part.sh").chmod(0o644)
        assert "images/engine/lib/part.sh" in as_nobody(
            lambda: [f.path for f in make_plan(profiles, verify_lock=False, cwd=profiles.parent).engine.source.files])
    finally:
        shutil.rmtree(shared)


def test_a_hard_link_inside_the_project_is_baked_one_to_a_file_outside_is_refused(tmp_path):
    # a hard link's other name under the project (a fixture shared with the tests) is no way out of it
    from unibake.inputs import read_source

    root = tmp_path / "project"
    (root / "engine").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "engine" / "model.json").write_text("{}\n")
    os.link(root / "engine" / "model.json", root / "tests" / "model.json")
    os.link(root / "engine" / "model.json", root / "engine" / "same.json")
    assert [f.path for f in read_source(root, "engine", "product.yaml:9").files] == ["engine/model.json",
                                                                                    "engine/same.json"]
    outside = tmp_path / "elsewhere.json"
    os.link(root / "engine" / "model.json", outside)
    with pytest.raises(InputError, match=r"^product\.yaml:9: 'engine/model\.json' is a hard link to a file outside the "
                                         r"project \(4 links, 3 of them under .*/project\); hard links, like "
                                         r"symlinks, must stay inside it: make it a file of its own \(cp "):
        read_source(root, "engine", "product.yaml:9")
    with pytest.raises(InputError, match=r"'engine/same\.json' is a hard link to a file outside"):
        read_source(root, "engine/same.json", "product.yaml:9", want="file")


def test_an_input_unchanged_since_the_last_plan_is_not_read_again_and_one_rewritten_in_place_is(
        busybox_product, cli, tmp_path, monkeypatch):
    from unibake import digestmemo

    monkeypatch.setattr(digestmemo, "SETTLE_NS", 0)  # the files were copied a moment ago (see the test below)
    env = {"CI": "true", "XDG_CACHE_HOME": str(tmp_path / "cache")}  # this user's key of the record
    first = cli("--stage", "render", "--config", str(busybox_product), env=env)
    assert first.code == 0 and "not read again" not in first.err
    again = cli("--stage", "render", "--config", str(busybox_product), env=env)
    assert again.code == 0
    assert re.search(r"\b[1-9][0-9]* input file\(s\), [0-9]+ bytes, not read again: unchanged since an earlier "
                     r"plan hashed them", again.err)
    # the same size, the same modification time (touch -d, a checkout's restored times): hashed again all the same
    changed = busybox_product.parent / "images/tune/tp2/cache-2.json"
    before = changed.stat()
    text = changed.read_text()
    changed.write_text(text.replace("2", "3", 1) if "2" in text else text.upper())
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert changed.stat().st_size == before.st_size and changed.read_text() != text
    refused = cli("--stage", "render", "--config", str(busybox_product), env=env)
    assert refused.code == 2 and "input 'images/tune/tp2/cache-2.json' differs from" in refused.err
    # a record this user's key did not sign (a checkout's) is not taken: every input hashed
    changed.write_text(text)
    record = busybox_product.parent / ".cache/build-memo" / digestmemo.FOLDER / digestmemo.FILE
    raw = json.loads(record.read_text())
    raw["mac"] = "0" * 64
    record.write_text(json.dumps(raw))
    assert "not read again" not in cli("--stage", "render", "--config", str(busybox_product), env=env).err
    # nor a record nested deeper than the stack (json.loads raises RecursionError, no ValueError): no traceback
    record.write_text("[" * 100_000)
    nested = cli("--stage", "render", "--config", str(busybox_product), env=env)
    assert nested.code == 0 and "Traceback" not in nested.err and "not read again" not in nested.err
    assert "not read again" in cli("--stage", "render", "--config", str(busybox_product), env=env).err
    # --no-cache hashes every input
    assert "not read again" not in cli("--stage", "render", "--no-cache", "--config", str(busybox_product), env=env).err


def test_an_input_changed_just_before_it_was_hashed_is_not_remembered(tmp_path):
    from unibake.digestmemo import DigestMemo
    from unibake.inputs import sha256_file

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    read = []

    def hashed(p):
        read.append(p)
        return sha256_file(p)

    for _ in range(2):  # written a moment ago: it could change again within the same tick of the clock
        memo = DigestMemo(tmp_path / "memo", b"k" * 32)
        assert memo.sha256(path, os.stat(path), hashed) == sha256_file(path)
        memo.save()
    assert len(read) == 2
    # two seconds later it is remembered, and then answered from the record
    later = [DigestMemo(tmp_path / "memo", b"k" * 32, now=lambda: os.stat(path).st_ctime_ns + 3_000_000_000)
             for _ in range(2)]
    later[0].sha256(path, os.stat(path), hashed)
    later[0].save()
    later[1] = DigestMemo(tmp_path / "memo", b"k" * 32)
    assert later[1].sha256(path, os.stat(path), hashed) == sha256_file(path) and len(read) == 3
    assert later[1].remembered == 1


def test_the_digest_record_is_not_written_through_a_link_a_checkout_brought(tmp_path):
    from unibake.digestmemo import FILE, DigestMemo
    from unibake.errors import UnibakeError
    from unibake.inputs import sha256_file

    path, elsewhere = tmp_path / "f", tmp_path / "elsewhere"
    path.write_bytes(b"x")
    elsewhere.mkdir()
    (tmp_path / "project" / ".cache").mkdir(parents=True)
    (tmp_path / "project" / ".cache" / "build-memo").symlink_to(elsewhere)
    memo = DigestMemo(tmp_path / "project" / ".cache" / "build-memo" / "inputs", b"k" * 32,
                      now=lambda: os.stat(path).st_ctime_ns + 3_000_000_000)
    memo.sha256(path, os.stat(path), sha256_file)
    with pytest.raises(UnibakeError, match=r"build-memo is a symlink"):
        memo.save()
    assert list(elsewhere.iterdir()) == [] and not (elsewhere / "inputs" / FILE).exists()


def test_a_lock_line_naming_what_no_input_can_be_is_refused_at_the_plan(busybox_product, cli):
    # found by probing: '<sha>  ../../../etc/passwd' added to the lock by hand passed every build without a word (an
    # entry outside every source is not checked), where a reviewer reads the lock as the list of what is baked
    lock_file = busybox_product / "inputs.lock"
    for name in ("../../../etc/passwd", "/opt/../etc/passwd", "images/./engine/serve.sh", "images//engine/x"):
        lock_file.write_text(lock_file.read_text().split(f"{'0' * 64}  ")[0] + f"{'0' * 64}  {name}\n")
        with pytest.raises(InputError, match=rf"^{re.escape(str(lock_file))} names '{re.escape(name)}', which no input "
                                             r"can be \(a path with '\.\.', or not written as the lock writes "
                                             r"it\); review the change, then run: python build.py lock"):
            make_plan(busybox_product)
    assert cli("lock", "--config", str(busybox_product)).code == 0  # the way out drops it
    assert "etc/passwd" not in lock_file.read_text() and "images/./" not in lock_file.read_text()
    make_plan(busybox_product)

