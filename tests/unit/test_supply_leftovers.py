"""Signatures, kit and SBOM cases the first hardening left over (fake engines, Debian's real gpg,
gpgv and minisign with throwaway keys)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from ..conftest import REPO, busybox_product, gpg_home, minisign_key, run, throwaway_gpg_home  # noqa: F401 - fixtures used by name
from ..forge import resum
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import engines, release  # noqa: F401 - the fixture is used by name

SCRIPT = REPO / "scripts" / "verify-release.sh"


def shell(folder, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), str(folder), "--no-load", *args], capture_output=True, text=True,
                          timeout=120)


def resign_minisign(secret, path, *comment: str) -> None:
    """The key holder's signature of ``path`` (its trusted comment given, or minisign's own)."""
    made = run("minisign", "-S", "-s", str(secret), "-m", str(path), "-x", f"{path}.minisig",
               *(("-t", comment[0]) if comment else ()))
    assert made.returncode == 0, made.stderr


def test_a_minisign_trusted_comment_naming_another_release_fails_both_verifiers(engines, tmp_path, minisign_key,  # noqa: F811
                                                                                cli):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    good = cli("verify", str(folder), "--key", str(public))
    assert good.code == 0 and "its trusted comment names demo 1.0" in good.err, good.err
    assert shell(folder, "--key", str(public)).returncode == 0
    # the same key's signature of 1.0's sums, its trusted comment saying 2.0: shown as 2.0's until now
    resign_minisign(secret, folder / "SHA256SUMS", "demo 2.0 SHA256SUMS")
    refused = cli("verify", str(folder), "--key", str(public))
    assert refused.code == 3 and refused.error_lines == [
        "error: SHA256SUMS.minisig: signature check failed: its trusted comment says 'demo 2.0 SHA256SUMS', but this "
        "is 'demo 1.0 SHA256SUMS' (manifest.json): a signature made for another release or file"], refused.err
    script = shell(folder, "--key", str(public))
    assert script.returncode == 3 and script.stderr.splitlines() == [
        f"error: {folder}: SHA256SUMS.minisig's trusted comment says 'demo 2.0 SHA256SUMS', but this is "
        "'demo 1.0 SHA256SUMS' (manifest.json): a signature made for another release or file"], script.stderr
    # a comment of the publisher's own (minisign's default, a hand-made signature) is shown, not compared
    for own in ((), ("signed by ops",)):
        resign_minisign(secret, folder / "SHA256SUMS", *own)
        assert cli("verify", str(folder), "--key", str(public)).code == 0
        assert shell(folder, "--key", str(public)).returncode == 0
    # the provenance's signature says which file it signs: one made for another file is refused too
    resign_minisign(secret, folder / "provenance.intoto.json", "demo 1.0 SHA256SUMS")
    wrong = cli("verify", str(folder), "--key", str(public))
    assert wrong.code == 3 and "provenance.intoto.json.minisig: signature check failed: its trusted comment says " \
        "'demo 1.0 SHA256SUMS', but this is 'demo 1.0 provenance.intoto.json'" in wrong.error_lines[-1], wrong.err
    # nor is it signed again by push (its fresh signature would launder the comment)
    resign_minisign(secret, folder / "provenance.intoto.json", "demo 1.0 provenance.intoto.json")
    resign_minisign(secret, folder / "SHA256SUMS", "demo 2.0 SHA256SUMS")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    pushed = cli("push", str(folder), "--to", "127.0.0.1:9/demo", "--sign-minisign", str(secret),
                 env={"CI": "true", "PATH": os.environ["PATH"]})
    assert pushed.code == 3 and "its trusted comment says 'demo 2.0 SHA256SUMS'" in pushed.error_lines[-1] and \
        "signed again only over a good signature by the same key" in pushed.error_lines[-1], pushed.err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_sums_signature_co_signed_by_a_key_not_given_passes_and_a_bad_or_foreign_one_still_fails(
        engines, tmp_path, cli):  # noqa: F811
    with throwaway_gpg_home() as (env, public):
        made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Co Signer <co@example.invalid>",
                   "ed25519", "sign", "never", env=env)
        assert made.returncode == 0, made.stderr
        other = tmp_path / "co.asc"
        other.write_text(run("gpg", "--armor", "--export", "co@example.invalid", env=env).stdout)
        folder = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid")["release"].folder
        sums, asc = folder / "SHA256SUMS", folder / "SHA256SUMS.asc"

        def sign(*users, data=sums):
            out = tmp_path / "sig.asc"
            made = run("gpg", "--batch", "--yes", "--armor", "--detach-sign", *(f"--local-user={u}" for u in users),
                       "--output", str(out), str(data), env=env)
            assert made.returncode == 0, made.stderr
            return out.read_text()

        def both(key):
            python, script = cli("verify", str(folder), "--key", str(key)), shell(folder, "--key", str(key))
            return python.code, script.returncode, python.err, script.stderr

        # one signature block by the publisher and a co-signer (gpg -u A -u B): gpgv exits 2 for the one
        # whose key it was not given, and the release failed though the publisher's signature is good
        asc.write_text(sign("signer@example.invalid", "co@example.invalid"))
        code, script, err, _ = both(public)
        assert (code, script) == (0, 0) and "1 more by keys not given, not checked" in err, err
        # the co-signer's key verifies the sums too, not the provenance, which the publisher alone signed: both
        # verifiers say so (before: the shell checked no provenance signature, and passed what build.py verify failed)
        code, script, err, script_err = both(other)
        assert (code, script) == (3, 3), err + script_err
        assert "provenance.intoto.json.asc: signature check failed" in err, err
        assert "provenance.intoto.json.asc is not a good signature of provenance.intoto.json" in script_err, script_err
        # two armoured blocks, one each, likewise
        asc.write_text(sign("co@example.invalid") + sign("signer@example.invalid"))
        assert both(public)[:2] == (0, 0)
        # signed only by the other key: not the publisher's
        asc.write_text(sign("co@example.invalid"))
        code, script, err, script_err = both(public)
        assert (code, script) == (3, 3) and "signature check failed: BAD" in err and \
            "is not a good signature of SHA256SUMS" in script_err, err + script_err
        # the publisher's signature of something else beside the co-signer's good one: bad by the key given
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_text("another release's sums\n")
        asc.write_text(sign("signer@example.invalid", data=elsewhere) + sign("co@example.invalid"))
        assert both(public)[:2] == (3, 3)
        # and the co-signed file over sums changed after it was signed
        asc.write_text(sign("signer@example.invalid", "co@example.invalid"))
        sums.write_text(sums.read_text().replace("  IMAGE_ID\n", "  IMAGE_ID\n", 1) + "0" * 64 + "  extra\n")
        assert both(public)[:2] == (3, 3)
        assert both(other)[:2] == (3, 3)


def test_a_co_signer_s_user_id_reaches_the_terminal_from_neither_verifier_as_it_is(engines, tmp_path, cli):  # noqa: F811
    # found by review: a mirror co-signs SHA256SUMS with a key whose mailbox holds a bidi override and a C1 CSI;
    # gpgv prints it (`issuer "x<U+202E>y<U+009B>2jz@..."`) and the shell verifier passed gpgv's stderr on as it was
    evil = "x\u202ey\u009b2Jz@example.invalid"
    with throwaway_gpg_home() as (env, public):
        made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", evil, "ed25519", "sign", "never", env=env)
        assert made.returncode == 0, made.stderr
        folder = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid")["release"].folder
        out = tmp_path / "sig.asc"
        signed = run("gpg", "--batch", "--yes", "--armor", "--detach-sign", "--local-user=signer@example.invalid",
                     f"--local-user={evil}", "--output", str(out), str(folder / "SHA256SUMS"), env=env)
        assert signed.returncode == 0, signed.stderr
        (folder / "SHA256SUMS.asc").write_bytes(out.read_bytes())
        python = cli("verify", str(folder), "--key", str(public))
        script = subprocess.run(["sh", str(REPO / "scripts" / "verify-release.sh"), str(folder), "--no-load", "--key",
                                 str(public)], capture_output=True, timeout=120)
        assert python.code == 0 and script.returncode == 0, python.err + script.stderr.decode()
        said = script.stdout + script.stderr
        assert "\u202e".encode() not in said and "\u009b".encode() not in said and b"\x9b" not in said, said
        assert b"x?y?2jz@example.invalid" in said.lower(), said  # (shown, as '?' where it would drive the terminal)
        assert "\u202e" not in python.err and "\u009b" not in python.err


def test_kit_key_checks_the_release_s_signature_before_trusting_its_sums(cli, tmp_path, minisign_key):  # noqa: F811
    secret, public = minisign_key
    folder = tmp_path / "out" / "1.3.1"
    shutil.copytree(REPO / "release/1.3.1", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["supply_chain"]["kit"] = None  # a release that published no kit: the one written now is taken as is
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)
    resign_minisign(secret, folder / "SHA256SUMS", "demo-llm 1.3.1 SHA256SUMS")  # as the publisher signed it

    def kit(*key: str):
        out = tmp_path / "kit"
        shutil.rmtree(out, ignore_errors=True)
        return cli("kit", str(folder), "--out", str(out), "--config", str(REPO / "profiles"), *key), out

    good, out = kit("--key", str(public))
    assert good.code == 0 and "the release published none" in good.err, good.err
    kit_json = read_kit_json(out)
    assert kit_json["image_id"] == manifest["image_id"]
    # the downloaded folder forged after it was signed: another image ID, SHA256SUMS rewritten to match
    manifest["image_id"] = "sha256:" + "1" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    signature = (folder / "SHA256SUMS.minisig").read_bytes()
    (folder / "SHA256SUMS.minisig").unlink()
    resum(folder)
    (folder / "SHA256SUMS.minisig").write_bytes(signature)
    unsigned, out = kit()
    assert unsigned.code == 0 and read_kit_json(out)["image_id"] == "sha256:" + "1" * 64  # what --key is for
    refused, out = kit("--key", str(public))
    assert refused.code == 3 and refused.error_lines == [
        "error: SHA256SUMS.minisig: signature check failed: BAD: not a valid signature of SHA256SUMS by "
        f"{public.name} (Signature verification failed)"], refused.err
    assert not out.exists()
    # the forger's folder signed by the same key for another release: its trusted comment says so
    resign_minisign(secret, folder / "SHA256SUMS", "demo-llm 1.2.0 SHA256SUMS")
    other, out = kit("--key", str(public))
    assert other.code == 3 and "its trusted comment says 'demo-llm 1.2.0 SHA256SUMS'" in other.error_lines[-1], \
        other.err
    assert not out.exists()
    (folder / "SHA256SUMS.minisig").unlink()
    absent, out = kit("--key", str(public))
    assert absent.code == 3 and "SHA256SUMS is not signed" in absent.error_lines[-1], absent.err


def read_kit_json(out):
    (kit,) = out.iterdir()
    data = zstandard.ZstdDecompressor().stream_reader(open(kit, "rb"), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("/kit.json")]
        return json.loads(tar.extractfile(member).read())


def test_a_single_file_egg_info_is_read_for_the_sbom_as_the_pkg_info_it_is(tmp_path):
    from ..savefixtures import tar_of
    from .test_contents import inspect

    site = "usr/lib/python3/dist-packages"
    pkg_info = b"Metadata-Version: 1.1\nName: six\nVersion: 1.16.0\nSummary: x\n\nlong text\n"
    first = tar_of([(f"{site}/six-1.16.0.egg-info", pkg_info, None),  # distutils' install_egg_info writes a file
                    (f"{site}/old-1.0.egg-info", b"Metadata-Version: 1.1\nName: old\nVersion: 1.0\n", None),
                    (f"{site}/chardet-4.0.0.egg-info", None, None),  # a folder, as setuptools writes it
                    (f"{site}/chardet-4.0.0.egg-info/PKG-INFO", b"Metadata-Version: 2.1\nName: chardet\n"
                     b"Version: 4.0.0\n", None)])
    # a later layer makes the single file a folder of another version: the file is gone
    second = tar_of([(f"{site}/old-1.0.egg-info", None, None),
                     (f"{site}/old-1.0.egg-info/PKG-INFO", b"Metadata-Version: 2.1\nName: old\nVersion: 1.1\n",
                      None)])
    archive, diff_ids = inspect([first, second], tmp_path=tmp_path)
    contents = archive.contents
    assert contents.problems == ()
    assert [(p.name, p.version, p.path, p.layer) for p in contents.packages] == [
        ("chardet", "4.0.0", f"/{site}/chardet-4.0.0.egg-info", diff_ids[0]),
        ("old", "1.1", f"/{site}/old-1.0.egg-info", diff_ids[1]),
        ("six", "1.16.0", f"/{site}/six-1.16.0.egg-info", diff_ids[0])]


def test_a_minisign_key_line_with_blanks_around_it_is_a_bad_key_not_a_bad_release(engines, tmp_path, minisign_key,  # noqa: F811
                                                                                 cli):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    comment, line = public.read_text().splitlines()[:2]
    key = tmp_path / "pasted.pub"
    # pasted from a web page: minisign trims only carriage returns, so it refused the key, and both verifiers
    # said exit 3 "not a good signature of SHA256SUMS": the release blamed for the key file
    for pasted in (f"{line} ", f"  {line}", f"{line}\t"):
        key.write_text(f"{comment}\n{pasted}\n")
        python, script = cli("verify", str(folder), "--key", str(key)), shell(folder, "--key", str(key))
        says = "its key line (line 2) has blanks around it, which minisign does not take: remove them"
        assert python.code == 2 and python.error_lines == [f"error: --key {key}: {says}"], python.err
        assert script.returncode == 2 and script.stderr == f"error: --key {key}: {says}\n", script.stderr
    key.write_text(f"{comment}\r\n{line}\r\r\n")  # carriage returns minisign trims: a key, for both
    assert cli("verify", str(folder), "--key", str(key)).code == 0
    assert shell(folder, "--key", str(key)).returncode == 0


def test_deploy_and_pull_key_check_the_signature_before_any_engine_or_registry_is_asked(engines, tmp_path,  # noqa: F811
                                                                                         minisign_key, cli):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    digest = "sha256:" + "1" * 64
    env = {"CI": "true", "PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    def commands(*key):
        return (cli("deploy", str(folder), "--engine", "tcp://127.0.0.1:9", *key, env=env),
                cli("deploy", str(folder), "--engine", "tcp://127.0.0.1:9", "--from", "registry", "--ref",
                    f"127.0.0.1:9/demo@{digest}", "--retries", "1", *key, env=env),
                cli("pull", f"127.0.0.1:9/demo@{digest}", "--release", str(folder), "--retries", "1", *key, env=env))

    # signed as released: the commands go on to the engine or the registry (none listens here)
    for result in commands("--key", str(public)):
        assert "signature" not in result.error_lines[-1] and ("127.0.0.1:9" in result.error_lines[-1]), result.err
    # the downloaded folder changed after it was signed, SHA256SUMS rewritten to match
    (folder / "run.sh").write_text("#!/bin/sh\necho pwned\n")
    signature = (folder / "SHA256SUMS.minisig").read_bytes()
    (folder / "SHA256SUMS.minisig").unlink()
    (folder / "SHA256SUMS").write_text("".join(
        line if not line.endswith("  run.sh\n") else
        f"{hashlib.sha256((folder / 'run.sh').read_bytes()).hexdigest()}  run.sh\n"
        for line in (folder / "SHA256SUMS").read_text().splitlines(keepends=True)))
    (folder / "SHA256SUMS.minisig").write_bytes(signature)
    for result in commands():  # unsigned: taken as it is
        assert "signature" not in result.error_lines[-1] and "127.0.0.1:9" in result.error_lines[-1], result.err
    for result in commands("--key", str(public)):
        assert result.code == 3 and result.error_lines == [
            "error: SHA256SUMS.minisig: signature check failed: BAD: not a valid signature of SHA256SUMS by "
            f"{public.name} (Signature verification failed)"], result.err


def test_an_alpine_base_s_packages_are_in_the_sbom_and_an_ndb_rpm_database_is_said_to_be_left_out(tmp_path):
    from ..savefixtures import tar_of
    from .test_sbom import document_of

    installed = (b"C:Q1abc=\nP:musl\nV:1.2.4-r2\nA:x86_64\nT:the musl c library\no:musl\nF:lib\nR:libc.so\n\n"
                 b"C:Q1def=\nP:libcrypto3\nV:3.1.4-r5\nA:x86_64\no:openssl\n\n")
    alpine = tar_of([("etc/os-release", b'ID=alpine\nVERSION_ID=3.19.1\nPRETTY_NAME="Alpine Linux v3.19"\n', None),
                     ("lib/apk/db/installed", installed, None)])
    (tmp_path / "a").mkdir()
    (tmp_path / "r").mkdir()
    contents, document = document_of([alpine], tmp_path / "a")
    # the SBOM of an Alpine base listed no OS package, and said nothing
    assert [(p.kind, p.name, p.version, p.arch, p.source) for p in contents.packages] == [
        ("apk", "libcrypto3", "3.1.4-r5", "x86_64", "openssl"), ("apk", "musl", "1.2.4-r2", "x86_64", "")]
    purls = sorted(c["purl"] for c in document["components"] if "purl" in c)
    assert purls == ["pkg:apk/alpine/libcrypto3@3.1.4-r5?arch=x86_64&distro=alpine-3.19.1",
                     "pkg:apk/alpine/musl@1.2.4-r2?arch=x86_64&distro=alpine-3.19.1"]
    # an RPM base with an NDB database (SUSE): it is not read, and that is said (an SQLite one, RHEL 9's, and a
    # Berkeley DB one, RHEL 8's, are read: test_rpmdb)
    rpm = tar_of([("etc/os-release", b'ID="sles"\nVERSION_ID="15.5"\n', None),
                  ("usr/lib/sysimage/rpm/Packages.db", bytes(4096), None)])
    contents, _ = document_of([rpm], tmp_path / "r")
    assert contents.packages == () and contents.problems == (
        "/usr/lib/sysimage/rpm/Packages.db is an RPM database, which unibake does not read: the packages it lists are "
        "not in the SBOM",)


def test_a_replayed_older_release_is_named_by_what_it_is_in_both_verifiers_last_line(engines, tmp_path, minisign_key,  # noqa: F811
                                                                                    cli):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    # a mirror serves 1.0's folder, signed and whole, as 2.0: every check passes; the last line says which it is
    replayed = folder.parent / "2.0"
    shutil.copytree(folder, replayed)
    image_id = (folder / "IMAGE_ID").read_text().strip()
    python = cli("verify", str(replayed), "--key", str(public))
    assert python.code == 0 and f"(demo:1.0, image {image_id[:19]})" in python.err.strip().splitlines()[-1]
    script = shell(replayed, "--key", str(public))
    assert script.returncode == 0 and script.stdout.splitlines()[-1] == \
        f"ok: demo:1.0 (image {image_id}): sums, zstd and the archive's structure (not loaded)", script.stdout


def test_a_conda_environment_s_packages_are_in_the_sbom_by_their_records_names(tmp_path):
    from ..savefixtures import tar_of
    from .test_sbom import document_of

    record = json.dumps({"name": "openssl", "files": ["lib/libssl.so.3"] * 5000}).encode()  # megabytes, not read
    layer = tar_of([("opt/conda/conda-meta/openssl-3.0.13-h7f8727e_2.json", record, None),
                    ("opt/conda/conda-meta/python-3.11.8-h955ad1f_0.json", b"{}", None),
                    ("opt/conda/conda-meta/history", b"==> 2024 <==\n", None),
                    ("opt/conda/envs/srv/conda-meta/libgcc-ng-13.2.0-h807b86a_5.json", b"{}", None),
                    ("opt/conda/conda-meta/odd.json", b"{}", None)])
    (tmp_path / "c").mkdir()
    contents, document = document_of([layer], tmp_path / "c")
    # a conda-based image (PyTorch's): its Python, OpenSSL and CUDA libraries were in no SBOM
    assert [(p.kind, p.name, p.version, p.source, p.path) for p in contents.packages] == [
        ("conda", "libgcc-ng", "13.2.0", "h807b86a_5", "/opt/conda/envs/srv/conda-meta/libgcc-ng-13.2.0-h807b86a_5.json"),
        ("conda", "openssl", "3.0.13", "h7f8727e_2", "/opt/conda/conda-meta/openssl-3.0.13-h7f8727e_2.json"),
        ("conda", "python", "3.11.8", "h955ad1f_0", "/opt/conda/conda-meta/python-3.11.8-h955ad1f_0.json")]
    assert contents.problems == ("/opt/conda/conda-meta/odd.json is not named NAME-VERSION-BUILD.json, as conda names "
                                 "its records: left out",)
    assert sorted(c["purl"] for c in document["components"] if "purl" in c) == [
        "pkg:conda/libgcc-ng@13.2.0?build=h807b86a_5", "pkg:conda/openssl@3.0.13?build=h7f8727e_2",
        "pkg:conda/python@3.11.8?build=h955ad1f_0"]


def test_a_python_without_unidiff_is_told_so_in_one_line_and_the_kit_asks_for_what_build_py_asks(tmp_path):
    import site
    import sys

    # a python3 holding every package build.py asked for but unidiff (Debian's python3-* packages and pip)
    hidden = tmp_path / "site"
    hidden.mkdir()
    for folder in site.getsitepackages():
        for entry in Path(folder).iterdir():
            if not entry.name.lower().startswith("unidiff") and not (hidden / entry.name).exists():
                (hidden / entry.name).symlink_to(entry)
    result = subprocess.run([sys.executable, "-S", str(REPO / "build.py"), "verify", str(REPO / "release/1.3.1")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(hidden), "UNIBAKE_REEXEC": "1"})  # not into .venv
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"error: the Python package 'unidiff' is not installed for {sys.executable}: run scripts/setup.sh (it makes "
        ".venv with every pinned dependency), then python build.py again"], result.stderr
    # the kit's verify.sh takes python3 as it is only when it has all of them (else a traceback in the rebuild)
    namespace: dict = {"__file__": str(REPO / "build.py")}
    exec((REPO / "build.py").read_text().split("\n\n\ndef ")[0], namespace)
    template = (REPO / "unibake/templates/kit-verify.sh.j2").read_text()
    needs = template.split('needs="import ', 1)[1].split('"', 1)[0]
    assert needs.split(", ") == list(namespace["NEEDED"])


def test_python_m_unibake_without_a_dependency_runs_in_the_checkouts_venv_or_says_so_in_one_line(tmp_path):
    import sys

    # found by probing: `python -m unibake` with a python3 lacking the packages ended in a ModuleNotFoundError
    # traceback, where `python build.py` goes on in .venv (README: "python -m unibake is it too")
    # a python3 whose zstandard cannot be imported (one found first on its path says so, as a missing one does;
    # the interpreter is otherwise this one, so that coverage follows it)
    hidden = tmp_path / "site" / "zstandard"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'zstandard\'", name="zstandard")\n')
    result = subprocess.run([sys.executable, "-m", "unibake", "-V"], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(hidden.parent), "UNIBAKE_REEXEC": "1"})
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"error: the Python package 'zstandard' is not installed for {sys.executable}: run scripts/setup.sh (it makes "
        ".venv with every pinned dependency), or pip install the unibake package, then run it again"], result.stderr
    # the interpreter the checkout's .venv was made from has none of them: the command goes on in .venv
    base = Path(sys.base_prefix) / "bin" / "python3"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UNIBAKE_REEXEC", "VIRTUAL_ENV")}
    assert subprocess.run([str(base), "-c", "import zstandard"], capture_output=True, env=env).returncode == 1
    result = subprocess.run([str(base), "-m", "unibake", "-V"], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env=env)
    assert result.returncode == 0 and result.stdout.startswith("unibake "), result.stdout + result.stderr


# the Pythons before 3.11 on this machine kind (pyenv keeps 3.6 to 3.13 beside the 3.11 the project runs on)
OLDER_PYTHONS = sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3")
                       if re.fullmatch(r"3\.([6-9]|10)\..*", p.parent.parent.name))


@pytest.mark.skipif(not OLDER_PYTHONS, reason="no Python before 3.11 on this machine")
@pytest.mark.parametrize("old", OLDER_PYTHONS or [""], ids=lambda p: Path(p).parent.parent.name)
def test_an_older_python3_first_on_path_goes_on_in_the_venv_or_says_what_it_needs_in_one_line(tmp_path, old):
    # found by an adopter's review: README says `python build.py` works with whatever python3 is first on PATH, but
    # Python 3.9 read build.py's `str | None` and ended in a TypeError traceback, 3.10 said "needs 3.11" though
    # .venv was there, `python -m unibake` on 3.10 ended in a tomllib ModuleNotFoundError traceback, and 3.6 read
    # `from __future__ import annotations` as a SyntaxError (3.7: importlib.metadata an ImportError)
    old = Path(old)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UNIBAKE_REEXEC", "VIRTUAL_ENV")}
    for command, cwd in (([str(old), str(REPO / "build.py"), "-V"], tmp_path), ([str(old), "-m", "unibake", "-V"], REPO)):
        went = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
        assert went.returncode == 0 and went.stdout.startswith("unibake "), went.stdout + went.stderr
        # without the checkout's .venv (UNIBAKE_REEXEC: as if it had been tried): one line, exit 1
        said = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd,
                              env={**env, "UNIBAKE_REEXEC": "1"})
        version = subprocess.run([str(old), "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True).stdout.strip()
        assert said.returncode == 1 and said.stderr.splitlines() == [
            f"error: unibake needs Python 3.11 or newer; this is {version} ({old}); run scripts/setup.sh, then "
            ".venv/bin/python build.py"], said.stderr


def test_the_one_line_python_m_unibake_says_without_a_dependency_outside_a_checkouts_venv(monkeypatch, capsys):
    import sys

    from unibake import __main__ as entry

    monkeypatch.setenv("UNIBAKE_REEXEC", "1")  # (as after the re-run into .venv: it is not run again)
    assert entry._without("zstandard") == 1
    assert capsys.readouterr().err == (
        f"error: the Python package 'zstandard' is not installed for {sys.executable}: run scripts/setup.sh (it makes "
        ".venv with every pinned dependency), or pip install the unibake package, then run it again\n")


def test_the_guides_say_which_trusted_comment_the_minisign_check_prints_for_this_release(engines, tmp_path,  # noqa: F811
                                                                                         minisign_key):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    printed = run("minisign", "-Vm", "SHA256SUMS", "-p", str(public), cwd=folder).stdout
    assert "Trusted comment: demo 1.0 SHA256SUMS\n" in printed
    for guide in ("README-DIST.md", "RELEASE_NOTES.md"):  # a downloader told what to see there spots a replay
        assert 'minisign -Vm SHA256SUMS -p publisher.pub   # prints "Trusted comment: demo 1.0 SHA256SUMS": this ' \
            "release\n" in (folder / guide).read_text()


def release_of_kit(kit: Path, releases: Path, secret: Path, byproducts: bool = True,
                   tarball: Path | None = None) -> Path:
    """The release an unpacked kit was written for, signed by its publisher: the example release with
    the kit's product, release and image, its provenance recording the kit's build context and Dockerfile,
    and ``tarball`` (the kit as written, unpacked at ``kit``) as its kit."""
    record = json.loads((kit / "kit.json").read_text())
    folder = releases / record["release"]
    shutil.copytree(REPO / "release/1.3.1", folder, ignore=shutil.ignore_patterns("*-kit.tar.zst"))
    provenance = json.loads((folder / "provenance.intoto.json").read_text())
    provenance["predicate"]["runDetails"]["byproducts"] = [
        {"digest": {"sha256": record["context_sha256"]}, "name": "context.tar"},
        {"digest": {"sha256": record["dockerfile_sha256"]}, "name": "Dockerfile"}] if byproducts else []
    # its materials: the kit's profiles and lock, as the release's provenance records them
    lines = (kit / "kit.sha256").read_text().splitlines()
    ledger = {name: sha for sha, name in (line.split("  ", 1) for line in lines)}
    definition = provenance["predicate"]["buildDefinition"]
    definition["resolvedDependencies"] = [
        *(d for d in definition["resolvedDependencies"]
          if d.get("annotations", {}).get("role") not in ("profile", "lock")),
        *({"annotations": {"role": "profile"}, "digest": {"sha256": sha}, "name": name} for name, sha in ledger.items()
          if name.endswith((".yaml", ".yml")) and not name.startswith("tool/")),
        {"annotations": {"role": "lock"}, "digest": {"sha256": ledger["inputs.lock"]}, "name": "profiles/inputs.lock"}]
    (folder / "provenance.intoto.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    data = (folder / "provenance.intoto.json").read_bytes()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(product=record["product"], release=record["release"], image_id=record["image_id"])
    manifest["supply_chain"]["provenance"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if tarball is not None:
        shutil.copyfile(tarball, folder / tarball.name)
        data = tarball.read_bytes()
        manifest["supply_chain"]["kit"].update(name=tarball.name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (folder / "IMAGE_ID").write_text(record["image_id"] + "\n")
    resum(folder)
    resign_minisign(secret, folder / "SHA256SUMS", f"{record['product']} {record['release']} SHA256SUMS")
    return folder


def test_rebuild_release_key_refuses_a_kit_that_names_another_image_than_the_signed_release(busybox_product,  # noqa: F811
                                                                                             tmp_path, minisign_key,
                                                                                             cli):
    from .test_kit import forge_kit_json, make_kit, unpack

    secret, public = minisign_key
    tarball = make_kit(busybox_product, tmp_path / "out")[0]
    kit = unpack(tarball, tmp_path / "unpacked")
    record = json.loads((kit / "kit.json").read_text())
    folder = release_of_kit(kit, tmp_path / "releases", secret, tarball=tarball)
    manifest = json.loads((folder / "manifest.json").read_text())

    def rebuild(*more):
        return cli("--engine", "tcp://127.0.0.1:9", "rebuild", str(kit), *more)

    def reaches_the_engine(*more):  # (the unit tests' guard stops it there)
        with pytest.raises(AssertionError, match="a unit test tried to reach a container engine"):
            rebuild(*more)
        return True

    assert reaches_the_engine("--release", str(folder), "--key", str(public))  # the kit is the release's
    # found by review: a file of its tool (which ./verify.sh --rebuild runs) rewritten, the ledger redone: the kit
    # checks against itself, and --release compared only its context, Dockerfile, lock and profiles ("identical")
    tool = kit / "tool" / "unibake" / "cli.py"
    kept = tool.read_bytes()
    tool.write_bytes(kept + b"\nimport os; os.system('id')  # a trojan\n")
    from .test_kit import relist_file
    ledger = (kit / "kit.sha256").read_bytes()
    relist_file(kit, "tool/unibake/cli.py")
    assert reaches_the_engine()
    trojan = rebuild("--release", str(folder), "--key", str(public))
    assert trojan.code == 3 and trojan.error_lines == [
        f"error: {kit}: its files are not those of the release's kit {tarball.name} (its kit.sha256 differs from the "
        "one in that tarball: its tool, verify.sh, README or kit.json were changed): not its kit"], trojan.err
    tool.write_bytes(kept)
    (kit / "kit.sha256").write_bytes(ledger)
    # the kit's files, ledger and kit.json rewritten alike (another image): the kit alone cannot tell
    forge_kit_json(kit, lambda r: r.update(image_id="sha256:" + "f" * 64))
    assert reaches_the_engine()
    refused = rebuild("--release", str(folder), "--key", str(public))
    assert refused.code == 3 and refused.error_lines == [
        f"error: {kit}: a kit of {record['product']} {record['release']}, image sha256:{'f' * 64}; the release in "
        f"{folder} is {record['product']} {record['release']}, image {record['image_id']}: not its kit"], refused.err
    # nor may the release be rewritten to match it: its signature says so
    manifest["image_id"] = "sha256:" + "f" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    signature = (folder / "SHA256SUMS.minisig").read_bytes()
    (folder / "SHA256SUMS.minisig").unlink()
    resum(folder)
    (folder / "SHA256SUMS.minisig").write_bytes(signature)
    forged = rebuild("--release", str(folder), "--key", str(public))
    assert forged.code == 3 and "SHA256SUMS.minisig: signature check failed: BAD" in forged.error_lines[-1], forged.err
    lone = rebuild("--key", str(public))
    assert lone.code == 2 and lone.error_lines == [
        "error: --key goes with --release DIR: a kit is not signed, its release's SHA256SUMS is"], lone.err


@pytest.mark.parametrize("recorded", ["the release's context", "no context"])
def test_rebuild_release_refuses_a_kit_built_around_another_context_than_the_signed_provenance_records(
        busybox_product, tmp_path, minisign_key, cli, recorded):  # noqa: F811
    from .test_kit import agree_with_context, forge_kit_json, make_kit, relist_file, unpack

    secret, public = minisign_key
    kit = unpack(make_kit(busybox_product, tmp_path / "out")[0], tmp_path / "unpacked")
    record = json.loads((kit / "kit.json").read_text())
    folder = release_of_kit(kit, tmp_path / "releases", secret, byproducts=recorded == "the release's context")
    # the kit's files, ledger and kit.json rewritten alike around a context that builds the released image
    # itself (the engine holds it once the release is loaded): it would rebuild to the release's ID
    dockerfile = b"FROM demo:1.0\n"
    (kit / "Dockerfile").write_bytes(dockerfile)
    info = tarfile.TarInfo("Dockerfile")
    info.size, info.mode, info.mtime = len(dockerfile), 0o644, record["source_date_epoch"]
    with tarfile.open(kit / "context.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(dockerfile))
    forge_kit_json(kit, lambda r: r.update(dockerfile_sha256=hashlib.sha256(dockerfile).hexdigest()))
    relist_file(kit, "Dockerfile")
    agree_with_context(kit)
    with pytest.raises(AssertionError, match="a unit test tried to reach a container engine"):
        cli("--engine", "tcp://127.0.0.1:9", "rebuild", str(kit))  # the kit alone cannot tell
    refused = cli("--engine", "tcp://127.0.0.1:9", "rebuild", str(kit), "--release", str(folder), "--key", str(public))
    context = hashlib.sha256((kit / "context.tar").read_bytes()).hexdigest()
    said = f"sha256 {record['context_sha256'][:16]}..." if recorded == "the release's context" else "none recorded"
    assert refused.code == 3 and refused.error_lines == [
        f"error: {kit}: its context.tar (sha256 {context[:16]}..., kit.json) is not the one release "
        f"{record['release']} was built from ({said} in its provenance.intoto.json): not its kit"], refused.err
    assert "Traceback" not in refused.err


def test_eggs_that_setup_py_install_leaves_are_in_the_sbom(tmp_path):
    from ..savefixtures import tar_of
    from .test_contents import inspect

    site = "usr/local/lib/python3.10/dist-packages"
    layer = tar_of([(f"{site}/flash_attn-2.5.6-py3.10-linux-x86_64.egg", None, None),  # setup.py install: a folder
                    (f"{site}/flash_attn-2.5.6-py3.10-linux-x86_64.egg/EGG-INFO", None, None),
                    (f"{site}/flash_attn-2.5.6-py3.10-linux-x86_64.egg/EGG-INFO/PKG-INFO",
                     b"Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.5.6\n", None),
                    (f"{site}/apex-0.1-py3.10-linux-x86_64.egg", b"PK\x03\x04 a zipped egg", None),  # zip_safe
                    (f"{site}/odd.egg", b"PK\x03\x04", None),
                    ("srv/data/model.egg", b"not a package", None)])
    archive, diff_ids = inspect([layer], tmp_path=tmp_path)
    contents = archive.contents
    assert [(p.kind, p.name, p.version, p.path) for p in contents.packages] == [
        ("pypi", "apex", "0.1", f"/{site}/apex-0.1-py3.10-linux-x86_64.egg"),
        ("pypi", "flash-attn", "2.5.6", f"/{site}/flash_attn-2.5.6-py3.10-linux-x86_64.egg")]
    assert contents.problems == (f"/{site}/odd.egg is not named NAME-VERSION-pyX.Y.egg, as setuptools names an egg: "
                                 "left out",)


def test_the_kit_s_readme_says_how_to_prove_it_is_the_release_s_kit(busybox_product, tmp_path):  # noqa: F811
    from .test_kit import make_kit, unpack

    kit = unpack(make_kit(busybox_product, tmp_path / "out")[0], tmp_path / "unpacked")
    assert "`python build.py rebuild DIR --release RELEASE_DIR --key PUBKEY`" in (kit / "README.md").read_text()


def test_push_sign_on_a_co_signed_sums_names_the_co_signature_it_drops(engines, tmp_path, cli, monkeypatch):  # noqa: F811
    # push --sign on SHA256SUMS.asc signed by the publisher and a co-signer: the new SHA256SUMS was
    # signed by the publisher alone and the co-signature dropped without a word
    from unibake import registry
    from unibake.manifest import load_manifest

    from .test_registry import RecordingClient

    with throwaway_gpg_home() as (env, public):
        made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Co Signer <co@example.invalid>",
                   "ed25519", "sign", "never", env=env)
        assert made.returncode == 0, made.stderr
        fingerprint = next(line.split(":")[9] for line in run("gpg", "--with-colons", "--list-keys", "co@example.invalid",
                                                             env=env).stdout.splitlines() if line.startswith("fpr:"))
        other = tmp_path / "co.asc"
        other.write_text(run("gpg", "--armor", "--export", "co@example.invalid", env=env).stdout)
        folder = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid")["release"].folder
        made = run("gpg", "--batch", "--yes", "--armor", "--detach-sign", "--local-user=signer@example.invalid",
                   "--local-user=co@example.invalid", "--output", str(folder / "SHA256SUMS.asc"),
                   str(folder / "SHA256SUMS"), env=env)
        assert made.returncode == 0, made.stderr
        real_push, uploads = registry.push_release, RecordingClient()
        monkeypatch.setattr(registry, "push_release", lambda folder, manifest, target, client, **kwargs:
                            real_push(folder, manifest, target, uploads, **kwargs))
        pushed = cli("push", str(folder), "--to", "reg.example/team/demo", "--sign", "signer@example.invalid",
                     env=env)
        assert pushed.code == 0, pushed.err
        assert f"SHA256SUMS.asc of release 1.0 is co-signed by {fingerprint}, whose key was not given: recording " \
               "the push signs the new SHA256SUMS with the keys given only, so that co-signature is dropped" in \
               " ".join(pushed.err.split()), pushed.err
        assert load_manifest(folder).registry and cli("verify", str(folder), "--key", str(public)).code == 0


def test_a_wrong_minisign_password_is_said_in_minisign_s_words_alone(tmp_path):
    from unibake.errors import UnibakeError
    from unibake.signing import check_keys

    made = run("minisign", "-G", "-p", str(tmp_path / "k.pub"), "-s", str(tmp_path / "k.key"), stdin="right\nright\n")
    assert made.returncode == 0, made.stderr
    with pytest.raises(UnibakeError) as refused:
        check_keys(None, tmp_path / "k.key", {"UNIBAKE_MINISIGN_PASSWORD": "wrong", "PATH": os.environ["PATH"]})
    # minisign's "Password: " prompt, on its own line of stderr, was shown as an empty part: "probe: ; Wrong ..."
    assert str(refused.value) == f"--sign-minisign {tmp_path / 'k.key'}: minisign could not sign probe: Wrong password " \
                                 "for that key"


def test_verify_key_with_another_minisign_key_names_the_release_s_signature_not_a_temporary_copy(
        engines, tmp_path, minisign_key, cli):  # noqa: F811
    secret, _ = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    made = run("minisign", "-G", "-W", "-p", str(tmp_path / "other.pub"), "-s", str(tmp_path / "other.key"))
    assert made.returncode == 0, made.stderr
    refused = cli("verify", str(folder), "--key", str(tmp_path / "other.pub"))
    assert refused.code == 3, refused.err
    line = next(line for line in refused.err.splitlines() if "SHA256SUMS.minisig" in line and "key id" in line)
    assert "unibake-verify-" not in refused.err and "/signature" not in refused.err, refused.err
    assert "(Signature key id in SHA256SUMS.minisig is " in line and "; but the key id in the public key is " in line


@pytest.mark.parametrize("signed", ["SHA256SUMS", "provenance.intoto.json"])
def test_verify_release_sh_key_with_another_minisign_key_names_the_release_s_signature_not_a_temporary_copy(
        engines, tmp_path, minisign_key, signed):  # noqa: F811
    # (before: minisign's own lines named the work folder's copy, "Signature key id in /tmp/tmp.X/sums.minisig")
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    other = tmp_path / "other.key"
    made = run("minisign", "-G", "-W", "-p", str(tmp_path / "other.pub"), "-s", str(other))
    assert made.returncode == 0, made.stderr
    if signed == "SHA256SUMS":
        key = tmp_path / "other.pub"
    else:  # the provenance signed by another key, SHA256SUMS (listing that signature) by the release's
        key = public
        resign_minisign(other, folder / signed, f"demo 1.0 {signed}")
        resum(folder)
        resign_minisign(secret, folder / "SHA256SUMS", "demo 1.0 SHA256SUMS")
    refused = shell(folder, "--key", str(key))
    assert refused.returncode == 3, refused.stderr
    lines = refused.stderr.splitlines()
    said = next(n for n, line in enumerate(lines) if line.startswith("Signature key id in "))
    # minisign's verdict, in its words, naming the release's file; then the one error line
    assert lines[said].startswith(f"Signature key id in {signed}.minisig is "), refused.stderr
    assert lines[said + 1].startswith("but the key id in the public key is "), refused.stderr
    assert lines[-1] == f"error: {folder}: {signed}.minisig is not a good signature of {signed} by {key}", lines
    assert "/sums.minisig" not in refused.stderr and "/provenance.minisig" not in refused.stderr, refused.stderr


def _unlabelled(server, created):  # noqa: F811
    """archive IMAGE's engines, the image without io.unibake.source-date-epoch and with its config's ``created``."""
    from unibake.metadata import METADATA_LABEL, PROFILES_LABEL

    from ..fake_engine import FakeEngine
    from .test_supply_chain import LAYERS, image_metadata

    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: image_metadata(server.server_port), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.0"}
    source.add({"architecture": "amd64", "os": "linux", "created": created,
                "config": {"Env": ["PATH=/bin"], "Labels": labels}, "history": [{"created_by": "x"}] * 2},
               LAYERS, tag="demo:1.0")
    return {None: source, "fake://verify": FakeEngine(address="fake://verify")}


def _sbom_time(folder) -> tuple[str, dict]:
    sbom = json.loads((folder / "sbom.cdx.json").read_text())
    image = sbom["metadata"]["component"]
    return sbom["metadata"]["timestamp"], {p["name"]: p["value"] for p in image.get("properties", [])}


def test_archive_of_an_image_without_the_epoch_label_dates_its_sbom_by_the_config_s_created(server, tmp_path):  # noqa: F811
    # (before: 1970-01-01T00:00:00, the epoch 0, for every such image)
    times = []
    for n in (1, 2):  # the same image: the same SBOM time, not the wall clock
        engines = _unlabelled(server, "2023-11-14T22:13:20.123456789Z")
        folder = release(engines, tmp_path / f"release{n}")["release"].folder
        times.append(_sbom_time(folder))
    assert times[0] == times[1]
    timestamp, props = times[0]
    assert timestamp == "2023-11-14T22:13:20+00:00"
    assert props["unibake:timestamp-from"] == "the image config's created"
    assert "unibake:source-date-epoch" not in props


@pytest.mark.parametrize("created", ["", "2023-11-14", "2023-11-14T22:13:20", "0001-01-01T00:00:00Z",
                                     "1969-12-31T23:59:59Z", "9999-01-01T00:00:00Z", "2023-13-40T22:13:20Z",
                                     "２０２３-11-14T22:13:20Z"])
def test_archive_of_an_image_whose_created_is_no_time_says_so_and_dates_its_sbom_1970(server, tmp_path, created):  # noqa: F811
    from unibake.pipeline import ARCHIVE, Request, run_stages, selection

    from .test_supply_chain import Quiet

    engines = _unlabelled(server, created)
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", image="demo:1.0", verify_engine="fake://verify")
    reporter = Quiet()
    results = run_stages(selection(ARCHIVE), request, reporter, connect=engines.__getitem__)
    timestamp, props = _sbom_time(results["release"].folder)
    assert timestamp == "1970-01-01T00:00:00+00:00" and props["unibake:timestamp-from"] == "none known"
    assert (f"warning: demo:1.0 has no io.unibake.source-date-epoch label and its config's created {created!r} is "
            "not an RFC 3339 time: the SBOM's timestamp is 1970-01-01") in reporter.stream.getvalue()
