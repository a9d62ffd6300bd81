"""Signatures, kit and SBOM cases the first hardening left over (fake engines, Debian's real gpg,
gpgv and minisign with throwaway keys)."""

from __future__ import annotations

import os
import subprocess

from ..conftest import REPO, gpg_home, minisign_key, run  # noqa: F401 - fixtures used by name
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
    resign_minisign(secret, folder / "SHA256SUMS")
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
