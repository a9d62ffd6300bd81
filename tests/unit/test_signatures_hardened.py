"""What an attack on a signed release tried, and what each verifier and `push --sign` must do about
it (fake engines, Debian's real gpg, gpgv and minisign with throwaway keys)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time

import pytest

from unibake import signing
from unibake.signing import GPG_PASSPHRASE, MINISIGN_PASSWORD, check_keys

from ..conftest import REPO, gpg_home, minisign_key, run, throwaway_gpg_home  # noqa: F401 - fixtures used by name
from .test_smoke import server  # noqa: F401 - the fixture is used by name
from .test_supply_chain import engines, release  # noqa: F401 - the fixture is used by name

SCRIPT = REPO / "scripts" / "verify-release.sh"


def shell(folder, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), str(folder), "--no-load", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def own_gpg():
    """A keyring of this test's own (the session's is shared: a key revoked or added here stays so)."""
    with throwaway_gpg_home() as made:
        yield made


def signed(engines, tmp_path, gpg_home, minisign_key):  # noqa: F811
    env, _ = gpg_home
    secret, _ = minisign_key
    return release(engines, tmp_path / "release", env=env, sign="signer@example.invalid",
                   sign_minisign=secret)["release"].folder


def test_a_signature_by_a_key_revoked_since_fails_both_verifiers(engines, tmp_path, own_gpg, minisign_key, cli):  # noqa: F811
    env, public = own_gpg
    folder = signed(engines, tmp_path, own_gpg, minisign_key)
    assert cli("verify", str(folder), "--key", str(public)).code == 0
    # the publisher revokes the key (its secret was stolen); gpgv still exits 0 on what it signed
    home = env["GNUPGHOME"]
    [certificate] = os.listdir(f"{home}/openpgp-revocs.d")
    text = open(f"{home}/openpgp-revocs.d/{certificate}").read().replace(":-----BEGIN", "-----BEGIN")
    assert run("gpg", "--batch", "--import", stdin=text, env=env).returncode == 0
    revoked = tmp_path / "revoked.asc"
    revoked.write_text(run("gpg", "--armor", "--export", "signer@example.invalid", env=env).stdout)
    refused = cli("verify", str(folder), "--key", str(revoked))
    assert refused.code == 3 and "made by a key that has been revoked" in refused.error_lines[-1], refused.err
    script = shell(folder, "--key", str(revoked))
    assert script.returncode == 3 and "revoked" in script.stderr, script.stdout + script.stderr


def test_a_key_file_holding_a_second_key_is_refused_by_both(engines, tmp_path, own_gpg, minisign_key, cli):  # noqa: F811
    env, public = own_gpg
    folder = signed(engines, tmp_path, own_gpg, minisign_key)
    # any key of a keyring makes gpgv's signature good: the attacker's key beside the publisher's would sign
    made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Mallory <m@example.invalid>", "ed25519",
               "sign", "never", env=env)
    assert made.returncode == 0, made.stderr
    both = tmp_path / "both.asc"
    both.write_text(run("gpg", "--armor", "--export", env=env).stdout)
    refused = cli("verify", str(folder), "--key", str(both))
    assert refused.code == 2 and "holds 2 OpenPGP keys; give the publisher's key alone" in refused.error_lines[-1]
    script = shell(folder, "--key", str(both))
    assert script.returncode == 2 and "holds 2 OpenPGP keys" in script.stderr, script.stderr
    # a gpg that cannot count them (older than 2.2.8: no --show-keys) fails closed, not open
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpg").write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = --show-keys ] && exit 2; done\n'
                                 f'exec {shutil.which("gpg")} "$@"\n')
    (bin_dir / "gpg").chmod(0o755)
    old = subprocess.run(["sh", str(SCRIPT), str(folder), "--no-load", "--key", str(public)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert old.returncode == 2 and "gpg 2.2.8 or later counts them" in old.stderr, old.stderr


def test_a_file_named_like_the_archive_that_the_sums_do_not_list_fails_and_another_is_named(engines, tmp_path, cli):  # noqa: F811
    folder = release(engines, tmp_path / "release")["release"].folder
    (folder / "publisher.pub").write_text("the key the guide says to save here\n")
    ok = cli("verify", str(folder))
    assert ok.code == 0 and "publisher.pub" in ok.err and "not part of the release, not read" in ok.err, ok.err
    assert shell(folder).returncode == 0
    # a part added after the release was made: `cat NAME.part-*` would have loaded it first
    forged = folder / "demo-1.0.tar.zst.part-+"
    forged.write_bytes(b"\x28\xb5\x2f\xfd" + b"x" * 64)
    refused = cli("verify", str(folder))
    assert refused.code == 3 and "demo-1.0.tar.zst.part-+: listed check failed: named like the archive" in \
        refused.error_lines[-1], refused.err
    script = shell(folder)
    assert script.returncode == 3 and "part-+: named like the archive" in script.stderr, script.stderr
    guide = (folder / "README-DIST.md").read_text() + (folder / "RELEASE_NOTES.md").read_text()
    assert ".part-*" not in guide


def test_the_guides_name_each_part_in_order_not_by_a_pattern(tmp_path):
    from ..savefixtures import layer_tar
    from .test_publish import make_release

    folder, _ = make_release(tmp_path / "release", split=1 << 20, layers=[layer_tar({"w.bin": os.urandom(2 << 20)})])
    parts = sorted(p.name for p in folder.glob("*.part-*"))
    assert len(parts) >= 2
    for name in ("README-DIST.md", "RELEASE_NOTES.md"):
        text = (folder / name).read_text()
        assert f"cat {' '.join(parts)} | zstd -dc | docker load" in text and ".part-*" not in text


def test_signatures_present_but_not_checked_are_said_so(engines, tmp_path, gpg_home, minisign_key, cli):  # noqa: F811
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    result = cli("verify", str(folder))
    assert result.code == 0 and "present, not checked: give the publisher's public key with --key" in result.err
    assert "(demo:1.0, image sha256:" in result.err  # which release this folder is, whatever its folder's name


def _packet(tag: int, body: bytes) -> bytes:
    """An OpenPGP packet in the new format, its length in 5 bytes (RFC 4880 4.2.2.3)."""
    return bytes([0xC0 | tag, 255]) + len(body).to_bytes(4, "big") + body


def test_a_signature_file_packing_many_signatures_is_refused_by_both_before_gpgv_checks_them(
        engines, tmp_path, gpg_home, minisign_key, cli):  # noqa: F811
    # found by review: the good signature 2 000 times over, compressed into one packet (a few kB): gpgv checked
    # every copy (2.5 ms each; a 1 MiB file of them, hours), build.py verify said "gpgv did not finish in 120 s"
    # (exit 1, the tool blamed) and verify-release.sh, with no time limit, printed "ok" when it ended
    import zlib

    env, public = gpg_home
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    made = subprocess.run(["gpg", "--batch", "--dearmor"], input=(folder / "SHA256SUMS.asc").read_bytes(),
                          capture_output=True, env={**os.environ, **env})
    assert made.returncode == 0 and made.stdout[0] & 0x80
    one = made.stdout
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = deflate.compress(one * 2000) + deflate.flush()
    cases = {"compressed": (_packet(8, b"\x01" + packed), "a packet of type 8"),
             "many": (one * 17, "more than 16 signatures")}
    for case, (data, said) in cases.items():
        (folder / "SHA256SUMS.asc").write_bytes(data)
        began = time.monotonic()
        result = cli("verify", str(folder), "--key", str(public))
        assert result.code == 3 and "not a detached signature" in result.error_lines[-1] \
            and said in result.error_lines[-1], (case, result.err)
        script = shell(folder, "--key", str(public))
        assert script.returncode == 3 and f"SHA256SUMS.asc is not a detached signature: {said}" in script.stderr, \
            (case, script.stderr)
        assert time.monotonic() - began < 30, case
    (folder / "SHA256SUMS.asc").write_bytes(one * 2)  # two copies of the good one: a file two signers signed
    assert cli("verify", str(folder), "--key", str(public)).code == 0
    assert shell(folder, "--key", str(public)).returncode == 0

def test_sums_too_big_or_holding_a_nul_are_refused_before_any_signature_tool_runs(
        engines, tmp_path, gpg_home, minisign_key, cli):  # noqa: F811
    _, public = gpg_home
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    sums = folder / "SHA256SUMS"
    original = sums.read_bytes()
    with open(sums, "r+b") as fh:
        fh.truncate(1 << 41)  # 2 TB, sparse: gpgv hashed it until its timeout
    start = time.monotonic()
    refused = cli("verify", str(folder), "--key", str(public))
    assert refused.code == 3 and "more than the 1048576" in refused.err and time.monotonic() - start < 30
    script = shell(folder, "--key", str(public))
    assert script.returncode == 3 and "more than 1048576 bytes" in script.stderr, script.stderr
    # a NUL byte: grep calls the file binary and the shell verifier's line check saw nothing
    sums.write_bytes(original.replace(b"  IMAGE_ID\n", b"  IMAGE_ID\x00\n"))
    script = shell(folder)
    assert script.returncode == 3 and "holds a NUL byte" in script.stderr, script.stderr
    assert cli("verify", str(folder)).code == 3


def test_the_sums_verified_are_the_sums_read_even_if_the_file_is_swapped_after_the_check(
        engines, tmp_path, gpg_home, minisign_key, cli, monkeypatch):  # noqa: F811
    _, public = gpg_home
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    real = signing._run

    def swap_after_gpgv(argv, *a, **kw):
        proc = real(argv, *a, **kw)
        if argv[0] == "gpgv":  # a concurrent writer: run.sh replaced and SHA256SUMS made to match
            old = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
            (folder / "run.sh").write_text("echo pwned\n")
            new = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
            (folder / "SHA256SUMS").write_text((folder / "SHA256SUMS").read_text().replace(old, new))
        return proc

    monkeypatch.setattr(signing, "_run", swap_after_gpgv)
    result = cli("verify", str(folder), "--key", str(public))
    assert result.code == 3 and "run.sh: sha256 check failed: differs from SHA256SUMS" in result.error_lines[-1], \
        result.err


def test_push_sign_does_not_sign_again_a_folder_changed_after_it_was_signed(
        engines, tmp_path, gpg_home, minisign_key, cli):  # noqa: F811
    env, _ = gpg_home
    secret, public = minisign_key
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    old = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
    (folder / "run.sh").write_text("echo pwned\n")
    new = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text((folder / "SHA256SUMS").read_text().replace(old, new))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    refused = cli("push", str(folder), "--to", "127.0.0.1:9/demo", "--sign", "signer@example.invalid",
                  "--sign-minisign", str(secret), env={"CI": "true", **env, "PATH": os.environ["PATH"]})
    assert refused.code == 3 and "SHA256SUMS.asc: BAD" in refused.error_lines[-1] and \
        "signed again only over a good signature by the same key" in refused.error_lines[-1], refused.err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing signed, nothing pushed
    assert cli("verify", str(folder), "--key", str(public)).code == 3


def test_the_signing_secrets_leave_the_environment_every_child_inherits(monkeypatch, tmp_path):
    from unibake.cli import main

    monkeypatch.setenv(GPG_PASSPHRASE, "pw")
    monkeypatch.setenv(MINISIGN_PASSWORD, "pw")
    main(["releases", "--out", str(tmp_path)], env=None, cwd=tmp_path)
    child = subprocess.run(["env"], capture_output=True, text=True).stdout  # what the smoke client, git, dockerd get
    assert GPG_PASSPHRASE not in child and MINISIGN_PASSWORD not in child


def test_a_passphrase_is_not_left_in_gpg_agent_after_signing_and_a_wrong_one_fails_the_probe(tmp_path):
    import tempfile

    home = tempfile.mkdtemp(prefix="ubp-")  # short: the agent's socket lives in it
    os.chmod(home, 0o700)
    env = {"GNUPGHOME": home, "PATH": os.environ["PATH"]}
    try:
        made = run("gpg", "--batch", "--passphrase", "pw-123", "--quick-gen-key", "P <p@example.invalid>",
                   "ed25519", "sign", "never", env=env)
        assert made.returncode == 0, made.stderr
        check_keys("p@example.invalid", None, {**env, GPG_PASSPHRASE: "pw-123"})
        probe = tmp_path / "probe"
        probe.write_text("x\n")
        later = run("gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "-u", "p@example.invalid",
                    "--detach-sign", "-o", str(tmp_path / "probe.sig"), str(probe), env=env)
        assert later.returncode != 0  # a later CI step cannot sign without the passphrase
        with pytest.raises(signing.InputError, match="gpg could not sign probe"):
            check_keys("p@example.invalid", None, {**env, GPG_PASSPHRASE: "wrong"})
    finally:
        run("gpgconf", "--kill", "gpg-agent", env=env)
        shutil.rmtree(home, ignore_errors=True)


def test_a_hotfix_on_a_release_without_its_archive_is_refused_before_anything_is_built(engines, tmp_path):  # noqa: F811
    # a fresh clone tracks release folders without their archives: the hotfix's round trip loads the
    # base release first, so that is bad input at once, not after a build (it was, after 21 s of one)
    from dataclasses import replace

    from unibake.pipeline import BY_NAME, Request, run_stages

    from .test_supply_chain import Quiet

    folder = release(engines, tmp_path / "release")["release"].folder
    (folder / "demo-1.0.tar.zst").unlink()
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", base="1.0", version="1.0.1")
    with pytest.raises(signing.InputError, match=r"loads release 1.0 first, but .*demo-1.0.tar.zst is missing; "
                                                 "restore it or use --no-roundtrip"):
        run_stages([BY_NAME["hotfix base"]], request, Quiet())
    base = run_stages([BY_NAME["hotfix base"]], replace(request, roundtrip=False), Quiet())["base"]
    assert base.manifest.release == "1.0"


def test_the_shell_verifier_s_usage_is_one_error_line_and_help_is_help(tmp_path):
    bogus = subprocess.run(["sh", str(SCRIPT), str(tmp_path), "--bogus"], capture_output=True, text=True)
    assert bogus.returncode == 2 and bogus.stderr.startswith("error: usage: verify-release.sh"), bogus.stderr
    helped = subprocess.run(["sh", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "Usage: scripts/verify-release.sh RELEASE_DIR" in helped.stdout, helped.stderr


@pytest.mark.parametrize("change, python, shell", [
    (lambda text: text + "a note the publisher added\n", 0, 0),  # minisign reads two lines, the rest is not its
    (lambda text: "\n" + text, 2, 2),  # the comment is not the first line: not a minisign key, for both
])
def test_both_verifiers_take_and_refuse_the_same_minisign_key_files(engines, tmp_path, minisign_key, cli, change,  # noqa: F811
                                                                    python, shell):
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    key = tmp_path / "key.pub"
    key.write_text(change(public.read_text()))
    assert cli("verify", str(folder), "--key", str(key)).code == python
    script = subprocess.run(["sh", str(SCRIPT), str(folder), "--no-load", "--key", str(key)], capture_output=True,
                            text=True, timeout=120)
    assert script.returncode == shell, script.stdout + script.stderr


def test_a_docker_credential_helper_run_for_a_push_never_sees_the_signing_secrets(tmp_path, monkeypatch):
    # docker-py runs credsStore helpers with os.environ plus the environment it is given: the secrets
    # must be in neither (push --sign reads credentials with them in the command's environment)
    from unibake.registry import load_credentials

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "helper-env"
    helper = bin_dir / "docker-credential-spy"
    helper.write_text(f"#!/bin/sh\nenv > {seen}\n"
                      'echo \'{"ServerURL": "r.example:5000", "Username": "u", "Secret": "p"}\'\n')
    helper.chmod(0o755)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"credsStore": "spy", "auths": {"r.example:5000": {}}}))
    path = f"{bin_dir}:{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)  # docker-py finds the helper on the process's PATH
    env = {"PATH": path, GPG_PASSPHRASE: "gpg-secret", MINISIGN_PASSWORD: "minisign-secret"}
    found = load_credentials("r.example:5000", env, config)
    assert found is not None and seen.is_file()
    assert "gpg-secret" not in seen.read_text() and "minisign-secret" not in seen.read_text()


def test_a_rotated_key_records_the_key_that_signs_not_its_revoked_predecessor(engines, tmp_path, own_gpg, minisign_key,  # noqa: F811
                                                                              cli):
    env, _ = own_gpg
    home = env["GNUPGHOME"]
    # the publisher rotates: a new key of the same user ID, the old one revoked and kept in the keyring
    made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Release Signer 2 <signer@example.invalid>",
               "ed25519", "sign", "never", env=env)
    assert made.returncode == 0, made.stderr
    old, new = [line.split(":")[9] for line in run("gpg", "--with-colons", "--list-secret-keys", "signer@example.invalid",
                                                   env=env).stdout.splitlines() if line.startswith("fpr:")]
    text = open(f"{home}/openpgp-revocs.d/{old}.rev").read().replace(":-----BEGIN", "-----BEGIN")
    assert run("gpg", "--batch", "--import", stdin=text, env=env).returncode == 0
    folder = release(engines, tmp_path / "release", env=env, sign="signer@example.invalid")["release"].folder
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [s["key"] for s in manifest["supply_chain"]["signatures"]] == [new]  # was the revoked key's
    public = tmp_path / "new.asc"
    public.write_text(run("gpg", "--armor", "--export", new, env=env).stdout)
    good = cli("verify", str(folder), "--key", str(public))
    assert good.code == 0 and f"good OpenPGP signature by {new}" in good.err, good.err


def test_the_shell_verifier_given_an_empty_key_refuses_rather_than_check_no_signature(engines, tmp_path, minisign_key,  # noqa: F811
                                                                                       cli):
    secret, _ = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    old = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()  # changed after signing, sums to match
    (folder / "run.sh").write_text("echo pwned\n")
    new = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text((folder / "SHA256SUMS").read_text().replace(old, new))
    # `--key "$PUBKEY"` with PUBKEY unset in CI: both verifiers refuse (the shell one checked nothing, exit 0)
    script = shell(folder, "--key", "")
    assert script.returncode == 2 and script.stderr == \
        "error: --key given empty (an unset variable?): give a value, or leave it out\n", script.stdout + script.stderr
    assert cli("verify", str(folder), "--key", "").code == 2


def test_a_key_option_given_twice_is_refused_not_the_first_key_dropped(engines, tmp_path, gpg_home, minisign_key,  # noqa: F811
                                                                       cli):
    env, public = gpg_home
    secret, minisign_public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    # no OpenPGP signature: the first key, given to be checked, was silently replaced by the second
    twice = cli("verify", str(folder), "--key", str(public), "--key", str(minisign_public))
    assert twice.code == 2 and twice.error_lines == [
        f"error: --key given twice ({str(public)!r} and {str(minisign_public)!r}): one public key is checked per run; "
        "run verify once for each key (see: python build.py verify --help)"], twice.err
    script = shell(folder, "--key", str(public), "--key", str(minisign_public))
    assert script.returncode == 2 and script.stderr == "error: --key given twice: one public key is checked per run; " \
        "run the script once for each key\n", script.stdout + script.stderr
    # signing: the first key would sign nothing
    for option, key in (("--sign", "signer@example.invalid"), ("--sign-minisign", str(secret))):
        refused = cli(option, key, option, key, "--out", str(tmp_path / "out"), env={"CI": "true", **env})
        assert refused.code == 2 and refused.error_lines[-1].startswith(f"error: {option} given twice"), refused.err
        assert not (tmp_path / "out").exists()


def test_a_second_key_in_an_armoured_block_of_another_kind_is_counted_as_gpgv_reads_it(engines, tmp_path, own_gpg,  # noqa: F811
                                                                                       minisign_key, cli):
    env, public = own_gpg
    folder = signed(engines, tmp_path, own_gpg, minisign_key)
    made = run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Mallory <m@example.invalid>", "ed25519",
               "sign", "never", env=env)
    assert made.returncode == 0, made.stderr
    # the folder changed, and SHA256SUMS signed again by Mallory
    old = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
    (folder / "run.sh").write_text("echo pwned\n")
    new = hashlib.sha256((folder / "run.sh").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text((folder / "SHA256SUMS").read_text().replace(old, new))
    assert run("gpg", "--batch", "--yes", "-u", "m@example.invalid", "--armor", "--detach-sign", "-o",
               str(folder / "SHA256SUMS.asc"), str(folder / "SHA256SUMS"), env=env).returncode == 0
    # the publisher's key, then Mallory's in a "PGP ARMORED FILE" block (gpg --enarmor): --show-keys
    # on the file lists one key, --dearmor puts both in gpgv's keyring
    mallory = subprocess.run(["gpg", "--export", "m@example.invalid"], capture_output=True, env={**os.environ, **env},
                             timeout=60).stdout
    armoured = subprocess.run(["gpg", "--enarmor"], input=mallory, capture_output=True, env={**os.environ, **env},
                              timeout=60).stdout.decode()
    assert "-----BEGIN PGP ARMORED FILE-----" in armoured
    both = tmp_path / "publisher.asc"
    both.write_text(public.read_text() + armoured)
    refused = cli("verify", str(folder), "--key", str(both))
    assert refused.code == 2 and "holds 2 OpenPGP keys; give the publisher's key alone" in refused.error_lines[-1], \
        refused.err
    script = shell(folder, "--key", str(both))
    assert script.returncode == 2 and "holds 2 OpenPGP keys" in script.stderr, script.stdout + script.stderr


def test_a_binary_openpgp_key_is_named_as_one_not_as_a_file_that_is_not_utf8(tmp_path, gpg_home, cli):  # noqa: F811
    env, _ = gpg_home
    key = tmp_path / "publisher.gpg"  # gpg --export without --armor, as keyrings are often handed out
    key.write_bytes(subprocess.run(["gpg", "--export", "signer@example.invalid"], capture_output=True,
                                   env={**os.environ, **env}, timeout=60).stdout)
    refused = cli("verify", str(tmp_path), "--key", str(key))
    assert refused.code == 2 and refused.error_lines == [
        f"error: --key {key}: not text, so neither an armoured OpenPGP public key nor a minisign public key (a binary "
        "OpenPGP key, as gpg --export writes it without --armor: import it and give gpg --armor --export KEYID)"], \
        refused.err


def test_the_downloaders_guide_fails_a_folder_stripped_of_its_signature(tmp_path):
    # its signature lines once ran only when the signature file was there: removing it (and rewriting
    # the sums) passed the guide's checks
    guide = (REPO / "README-DIST.md").read_text().split("## 2. Check the download", 1)[1].split("```sh\n", 1)[1]
    lines = [line for line in guide.split("```", 1)[0].splitlines() if "SHA256SUMS." in line or "minisign" in line]
    assert len(lines) == 2
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  IMAGE_ID\n")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    for line in lines:
        ran = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "GNUPGHOME": str(home)})
        assert ran.returncode != 0, line


def test_a_key_of_the_other_kind_than_the_release_s_signature_is_said_so_not_unsigned(engines, tmp_path, gpg_home,  # noqa: F811
                                                                                       minisign_key, cli):
    _, public = gpg_home
    secret, _ = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    refused = cli("verify", str(folder), "--key", str(public))
    assert refused.code == 3 and refused.error_lines[-1].endswith(
        "missing: SHA256SUMS has no openpgp signature (openpgp key publisher.asc given); it has SHA256SUMS.minisig: "
        "give the publisher's minisign public key"), refused.err
    script = shell(folder, "--key", str(public))
    assert script.returncode == 3 and script.stderr.endswith(
        "SHA256SUMS has no SHA256SUMS.asc; it has SHA256SUMS.minisig: give the publisher's minisign public key\n"), \
        script.stderr


@pytest.mark.parametrize("case", ["minisign secret key", "damaged minisign key", "openpgp secret key",
                                  "a text about secret keys", "openpgp public and secret keys", "a folder",
                                  "minisign key of another algorithm"])
def test_a_key_file_that_is_no_public_key_is_bad_usage_in_both_verifiers_not_a_bad_signature(
        engines, tmp_path, minisign_key, cli, case):  # noqa: F811
    secret, public = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    key = tmp_path / "key"
    if case == "minisign secret key":  # the wrong file of the pair
        key.write_bytes(secret.read_bytes())
        says = "this is a secret key; give the public one"
    elif case == "openpgp secret key":  # gpg --armor --export-secret-keys
        key.write_text("-----BEGIN PGP PRIVATE KEY BLOCK-----\r\n\r\nlQOYBGXyz\r\n-----END PGP PRIVATE KEY BLOCK-----\r\n")
        says = "this is a secret key; give the public one"
    elif case == "openpgp public and secret keys":  # found by probing: taken as one key (gpgv then refused all)
        key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGXyz\n-----END PGP PUBLIC KEY BLOCK-----\n"
                       "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGXyz\n-----END PGP PRIVATE KEY BLOCK-----\n")
        says = "holds a secret key besides the public one; give the public key alone"
    elif case == "a folder":  # found by probing: the shell said "no such file"
        key.mkdir()
        says = "not a regular file; give the publisher's public key"
    elif case == "a text about secret keys":  # (before: said to be a secret key, by these words in it)
        key.write_text("# Signing\n\nKeep the secret key offline; a PRIVATE KEY never leaves the host.\n")
        says = "neither an armoured OpenPGP public key"
    elif case == "minisign key of another algorithm":  # found by probing: the shell blamed the release, exit 3
        comment, line = public.read_text().splitlines()[:2]
        key.write_text(f"{comment}\nRWA{line[3:]}\n")  # 42 bytes in base64, not beginning "Ed"
        says = "neither an armoured OpenPGP public key"
    else:  # its key line cut short
        comment, line = public.read_text().splitlines()[:2]
        key.write_text(f"{comment}\n{line[:-4]}\n")
        says = "neither an armoured OpenPGP public key"
    python = cli("verify", str(folder), "--key", str(key))
    assert python.code == 2 and says in python.error_lines[-1], python.err
    # the shell verifier said "SHA256SUMS.minisig is not a good signature of SHA256SUMS" (exit 3): the release blamed
    script = shell(folder, "--key", str(key))
    assert script.returncode == 2 and says in script.stderr and "not a good signature" not in script.stderr, \
        script.stdout + script.stderr


def test_a_public_key_whose_comment_is_latin1_is_taken_by_both_verifiers(engines, tmp_path, gpg_home, minisign_key,  # noqa: F811
                                                                         cli):
    # found by probing: build.py verify read the whole key file as UTF-8 and called a key whose armour "Comment:" or
    # minisign comment line was in Latin-1 "a binary OpenPGP key" (exit 2), where gpg, minisign and the shell take it
    env, public_asc = gpg_home
    _, public = minisign_key
    folder = signed(engines, tmp_path, gpg_home, minisign_key)
    armoured = public_asc.read_bytes().split(b"\n")
    keys = {"publisher.asc": b"\n".join([armoured[0], b"Comment: Ren\xe9 the publisher", *armoured[1:]]),
            "publisher.pub": b"untrusted comment: cl\xe9 minisign\n" + public.read_bytes().split(b"\n", 1)[1]}
    for name, data in keys.items():
        key = tmp_path / name
        key.write_bytes(data)
        python = cli("verify", str(folder), "--key", str(key))
        assert python.code == 0, (name, python.err)
        script = shell(folder, "--key", str(key))
        assert script.returncode == 0, (name, script.stdout + script.stderr)


def test_a_huge_key_file_is_refused_by_both_verifiers_after_reading_a_bounded_part(engines, tmp_path, minisign_key,  # noqa: F811
                                                                                     cli):
    secret, _ = minisign_key
    folder = release(engines, tmp_path / "release", sign_minisign=secret)["release"].folder
    key = tmp_path / "huge.pub"
    with open(key, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: the shell verifier's grep and head read all of it (a 2 TB one for hours)
    python = cli("verify", str(folder), "--key", str(key))
    assert python.code == 2 and "more than the 1048576 it may hold" in python.error_lines[-1], python.err
    start = time.monotonic()
    script = shell(folder, "--key", str(key))
    assert script.returncode == 2 and script.stderr == f"error: --key {key}: more than 1048576 bytes; not a public key\n", \
        script.stderr
    assert time.monotonic() - start < 30
