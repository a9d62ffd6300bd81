"""Signatures of a release's ``SHA256SUMS`` (and of its provenance): OpenPGP and minisign.

Signing uses Debian's tools as a maintainer would: ``gpg`` with the keyring in ``GNUPGHOME``
(``--sign KEYID``: a detached ASCII-armoured ``FILE.asc``) and ``minisign`` (``--sign-minisign
KEYFILE``: ``FILE.minisig``). Keys come from the command line only, never from YAML. Passwords
come from the environment (``UNIBAKE_GPG_PASSPHRASE``, ``UNIBAKE_MINISIGN_PASSWORD``: a CI's secret
variables) and reach the tool through a pipe on its standard input: never an argument (``ps``
shows those), never a log line, never a child's environment. Without one, a key that needs it
fails at once instead of waiting at a prompt. The keys are tried on a probe before any work, so a
wrong password never costs a build.

Verifying (``build.py verify --key``, ``verify-release.sh --key``) takes a public key file: an
armoured OpenPGP key (checked with ``gpgv``, the verifier apt uses, against a keyring holding only
that key) or a minisign public key (``minisign -V``).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError, UnibakeError
from .files import read_small_file, write_atomic

GPG_PASSPHRASE = "UNIBAKE_GPG_PASSPHRASE"
MINISIGN_PASSWORD = "UNIBAKE_MINISIGN_PASSWORD"
SECRETS = (GPG_PASSPHRASE, MINISIGN_PASSWORD)
ASC, MINISIG = ".asc", ".minisig"
KEY_LIMIT = 1 << 20
TIMEOUT = 120  # seconds: a signing tool that waits longer is waiting for something we cannot give it


@dataclass(frozen=True, kw_only=True)
class SignatureRecord:
    """One kind of signature a release carries, and the key that made it."""

    kind: str  # openpgp | minisign
    key: str  # the OpenPGP fingerprint, or the minisign key ID
    suffix: str  # .asc | .minisig


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a signing tool runs with: ours, less the secrets (they go on its stdin)."""
    return {k: v for k, v in env.items() if k not in SECRETS}


def _run(argv: list[str], env: Mapping[str, str], stdin: str | None, what: str) -> subprocess.CompletedProcess:
    if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
        raise UnibakeError(f"{what}: {argv[0]} is not installed (Debian: apt-get install {argv[0]}; "
                           "scripts/setup.sh installs it)")
    try:
        return subprocess.run(argv, input=(stdin or "").encode(), capture_output=True, env=_child_env(env),
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UnibakeError(f"{what}: {argv[0]} did not finish in {TIMEOUT} s") from None


def _tail(proc: subprocess.CompletedProcess, prompt: str = "") -> str:
    """The last two lines the tool wrote to stderr, its ``prompt`` (minisign's ``Password: ``, written
    before its answer on the same line) taken out: a line that was the prompt alone is no line."""
    lines = [line.replace(prompt, "") if prompt else line for line in proc.stderr.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line.strip()]
    return "; ".join(lines[-2:])[:300] or f"exit {proc.returncode}"


@dataclass(frozen=True, kw_only=True)
class Signer:
    """The keys a release is signed with, checked; ``sign(path)`` writes ``path.asc`` / ``path.minisig``."""

    openpgp: str | None = None  # the key as given (ID, fingerprint or user ID)
    fingerprint: str = ""
    minisign: Path | None = None
    minisign_id: str = ""
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # holds the secrets

    @property
    def records(self) -> tuple[SignatureRecord, ...]:
        out = []
        if self.openpgp:
            out.append(SignatureRecord(kind="openpgp", key=self.fingerprint, suffix=ASC))
        if self.minisign:
            out.append(SignatureRecord(kind="minisign", key=self.minisign_id, suffix=MINISIG))
        return tuple(out)

    def sign(self, path: Path, comment: str = "", data: bytes | None = None) -> dict[str, str]:
        """Detached signatures of ``data`` (the bytes the caller wrote to ``path``; None: ``path``'s, read once,
        not through a link) beside ``path``; returns {file name: its text}. The tools sign a copy in a private
        folder of this process's, and write their signatures there: a staging folder someone else can write (a
        shared ``--out``) swapped while gpg ran had the key sign whatever file then had the name."""
        if data is None:
            data = read_small_file(path, UnibakeError, limit=64 << 20, follow=False)
        written = {}
        with tempfile.TemporaryDirectory(prefix="unibake-sign.") as private:  # (0700, made by this process)
            copy = Path(private) / path.name
            copy.write_bytes(data)
            if self.openpgp:
                written[path.name + ASC] = self._gpg(copy)
            if self.minisign:
                written[path.name + MINISIG] = self._minisign(copy, comment or path.name)[0]
        for name, text in written.items():  # (beside path, under a temporary name of its own first: no link followed)
            write_atomic(path.parent, name, text)
        return written

    def forget_passphrase(self) -> None:
        """gpg-agent keeps a passphrase it was given in its cache: after we sign, anyone who can reach
        the agent (a later CI step) could sign without it, and a wrong passphrase would pass the
        probe. With a passphrase from the environment the cache of our key is cleared, before the
        probe and after each signature."""
        if not self.openpgp or not self.env.get(GPG_PASSPHRASE) or not self.fingerprint:
            return
        try:  # best effort: a failure here must not hide the signature's own outcome
            listed = _run(["gpg", "--batch", "--with-keygrip", "--with-colons", "--list-secret-keys", "--",
                           self.fingerprint], self.env, None, f"--sign {self.openpgp}")
            grips = [line.split(":")[9] for line in listed.stdout.decode("utf-8", "replace").splitlines()
                     if line.startswith("grp:") and len(line.split(":")) > 9]
            for grip in grips:
                if grip.isalnum():
                    _run(["gpg-connect-agent", f"clear_passphrase --mode=normal {grip}", "/bye"], self.env, None,
                         f"--sign {self.openpgp}")
        except UnibakeError:
            pass

    @property
    def _local_user(self) -> str:
        """The key gpg signs with: the one whose fingerprint is recorded (a key given with ``!``, which
        names one subkey exactly, as given)."""
        return self.openpgp if self.openpgp.endswith("!") or not self.fingerprint else self.fingerprint

    def _gpg(self, path: Path) -> str:
        out = path.parent / f".{path.name}{ASC}.tmp"
        try:
            proc = _run(["gpg", "--batch", "--yes", "--no-tty", "--pinentry-mode", "loopback", "--passphrase-fd", "0",
                         "--local-user", self._local_user, "--armor", "--detach-sign", "--output", str(out), str(path)],
                        self.env, self.env.get(GPG_PASSPHRASE, ""), f"--sign {self.openpgp}")
            if proc.returncode != 0 or not out.is_file():
                hint = "" if self.env.get(GPG_PASSPHRASE) else f" (a key with a passphrase needs {GPG_PASSPHRASE})"
                raise UnibakeError(f"--sign {self.openpgp}: gpg could not sign {path.name}: {_tail(proc)}{hint}")
            text = out.read_text()
            os.replace(out, path.parent / (path.name + ASC))
            return text
        finally:
            out.unlink(missing_ok=True)
            self.forget_passphrase()

    def _minisign(self, path: Path, comment: str) -> tuple[str, str]:
        out = path.parent / f".{path.name}{MINISIG}.tmp"
        password = self.env.get(MINISIGN_PASSWORD)
        try:
            proc = _run(["minisign", "-S", "-s", str(self.minisign), "-m", str(path), "-x", str(out),
                         "-t", comment], self.env, (password + "\n") if password is not None else None,
                        f"--sign-minisign {self.minisign}")
            if proc.returncode != 0 or not out.is_file():
                hint = "" if password is not None else f" (a key with a password needs {MINISIGN_PASSWORD})"
                raise UnibakeError(f"--sign-minisign {self.minisign}: minisign could not sign {path.name}: "
                                   f"{_tail(proc, prompt='Password: ')}{hint}")
            text = out.read_text()
            os.replace(out, path.parent / (path.name + MINISIG))
            return text, minisign_key_id(text)
        finally:
            out.unlink(missing_ok=True)


def public_keys(signer: Signer, folder: Path) -> list[Path]:
    """The signer's public keys, written into ``folder``: the OpenPGP key exported from its keyring,
    the minisign key recreated from the secret one (``minisign -R``)."""
    keys = []
    if signer.openpgp:
        proc = _run(["gpg", "--batch", "--armor", "--export", "--", signer.fingerprint], signer.env, None,
                    f"--sign {signer.openpgp}")
        if proc.returncode != 0 or not proc.stdout.strip():
            raise UnibakeError(f"--sign {signer.openpgp}: gpg cannot export its public key: {_tail(proc)}")
        (folder / "openpgp.asc").write_bytes(proc.stdout)
        keys.append(folder / "openpgp.asc")
    if signer.minisign is not None:
        password = signer.env.get(MINISIGN_PASSWORD)
        proc = _run(["minisign", "-R", "-s", str(signer.minisign), "-p", str(folder / "minisign.pub")], signer.env,
                    (password + "\n") if password is not None else None, f"--sign-minisign {signer.minisign}")
        if proc.returncode != 0 or not (folder / "minisign.pub").is_file():
            raise UnibakeError(f"--sign-minisign {signer.minisign}: minisign cannot recreate its public key: "
                               f"{_tail(proc, prompt='Password: ')}")
        keys.append(folder / "minisign.pub")
    return keys


def minisign_key_id(text: str) -> str:
    """The key ID in a minisign signature or public key (as minisign prints it)."""
    lines = text.splitlines()
    try:
        raw = base64.b64decode(lines[1], validate=True)
    except (IndexError, ValueError):
        return ""
    return format(int.from_bytes(raw[2:10], "little"), "X") if len(raw) >= 10 else ""  # minisign's %llX


def _secret_keys(listing: bytes) -> list[tuple[str, str]]:
    """``gpg --with-colons --list-secret-keys``: each primary key's fingerprint and the capabilities
    of the whole key (an upper-case ``S``: it has a key that can sign now)."""
    keys: list[tuple[str, str]] = []
    capabilities = None
    for line in listing.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            capabilities = fields[11] if len(fields) > 11 else ""
        elif fields[0] == "fpr" and capabilities is not None and len(fields) > 9:
            keys.append((fields[9], capabilities))
            capabilities = None  # the fpr lines of its subkeys follow
    return keys


def check_keys(openpgp: str | None, minisign: Path | None, env: Mapping[str, str]) -> Signer | None:
    """The signing keys given on the command line, checked before any work: the tool is there, the
    secret key is, and it signs a probe (a wrong password fails here, not after the build)."""
    if not openpgp and minisign is None:
        return None
    fingerprint = ""
    if openpgp:
        if openpgp.startswith("-") or "\n" in openpgp:
            raise InputError(f"--sign {openpgp[:40]!r} is not a key ID, fingerprint or user ID")
        where = env.get("GNUPGHOME") or "~/.gnupg"
        proc = _run(["gpg", "--batch", "--with-colons", "--list-secret-keys", "--", openpgp], env, None,
                    f"--sign {openpgp}")
        keys = _secret_keys(proc.stdout)
        if proc.returncode != 0 or not keys:
            raise InputError(f"--sign {openpgp}: no secret key {openpgp!r} in the keyring of GNUPGHOME={where}")
        # the key gpg signs with: the first that can sign (a rotated key's revoked or expired
        # predecessor, matching the same user ID, is listed first and skipped by gpg too)
        usable = [fpr for fpr, capabilities in keys if "S" in capabilities]
        if not usable:
            raise InputError(f"--sign {openpgp}: no secret key {openpgp!r} that can sign in the keyring of "
                             f"GNUPGHOME={where} (revoked, expired or disabled: {', '.join(f for f, _ in keys)})")
        fingerprint = usable[0]
    if minisign is not None:
        if not minisign.is_file():
            raise InputError(f"--sign-minisign {minisign}: no such key file (make one with: minisign -G)")
        minisign = minisign.resolve()
    signer = Signer(openpgp=openpgp, fingerprint=fingerprint, minisign=minisign, env=env)
    signer.forget_passphrase()  # a passphrase the agent still holds would let a wrong one pass the probe
    with tempfile.TemporaryDirectory(prefix="unibake-sign-") as temp:
        probe = Path(temp) / "probe"
        probe.write_text("unibake signing probe\n")
        key_id = ""
        try:
            if openpgp:
                signer._gpg(probe)
            if minisign is not None:
                key_id = signer._minisign(probe, "unibake signing probe")[1]
        except UnibakeError as exc:  # a key that cannot sign, or a wrong password: bad input, before any work
            raise InputError(str(exc)) from None
    if minisign is not None:
        return Signer(openpgp=openpgp, fingerprint=fingerprint, minisign=minisign, minisign_id=key_id, env=env)
    return signer


def check_signer(signer: Signer, recorded: tuple, what: str) -> None:
    """A signed release signed again (``push`` recording its digest) must be signed by the very keys
    it records: each kind of signature it has, and no other (its provenance stays signed by them)."""
    given = {r.kind: r.key for r in signer.records}
    had = {s.kind: s.key for s in recorded}
    options = {"openpgp": "--sign", "minisign": "--sign-minisign"}
    if not had:
        raise InputError(f"{what} is not signed; --sign and --sign-minisign sign a signed release's SHA256SUMS "
                         "again, they do not sign an unsigned one (sign it when it is built)")
    for kind in had.keys() - given.keys():
        raise InputError(f"{what} is also signed by the {kind} key {had[kind]}: give {options[kind]} too, or its "
                         "signature would no longer match SHA256SUMS")
    for kind in given.keys() - had.keys():
        raise InputError(f"{options[kind]}: {what} has no {kind} signature to sign again")
    for kind, key in sorted(given.items()):
        if key != had[kind]:
            raise InputError(f"{options[kind]}: that is the {kind} key {key}, but {what} was signed by {had[kind]} "
                             "(manifest.json); sign it again with that key")


# ---------------------------------------------------------------------------------------------
# Verifying


@dataclass(frozen=True, kw_only=True)
class PublicKey:
    kind: str  # openpgp | minisign
    path: Path
    text: str

    @property
    def suffix(self) -> str:
        return ASC if self.kind == "openpgp" else MINISIG


def _minisign_key_line(line: str) -> bool:
    """An Ed25519 minisign public key: 42 bytes in base64, beginning with ``Ed``."""
    try:
        raw = base64.b64decode(line, validate=True)
    except ValueError:
        return False
    return len(raw) == 42 and raw[:2] == b"Ed"


SECRET_ARMOUR_RE = re.compile(r"^-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----\r?$", re.M)


def read_public_key(path: Path) -> PublicKey:
    """An armoured OpenPGP public key or a minisign public key; anything else is bad input."""
    data = read_small_file(path, InputError, limit=KEY_LIMIT, what="give the publisher's public key (--key)")
    # only ASCII is read of it (the armour lines, minisign's key line): a comment in Latin-1 (an armour's
    # "Comment:", minisign's first line) is gpg's and minisign's to take, and they take it
    text = data.decode("utf-8", "replace")
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" in text:
        if SECRET_ARMOUR_RE.search(text):  # (gpg --dearmor takes a secret block as a key too)
            raise InputError(f"--key {path}: holds a secret key besides the public one; give the public key alone")
        return PublicKey(kind="openpgp", path=path, text=text)
    # minisign reads the first two lines (a comment, the key) and nothing after: so does this, and so
    # does verify-release.sh, so that both take and refuse the same files
    lines = text.split("\n")
    if len(lines) >= 2 and lines[0].startswith("untrusted comment:"):
        # the key line as minisign reads it: only carriage returns are trimmed from its end
        if _minisign_key_line(lines[1].rstrip("\r")):
            return PublicKey(kind="minisign", path=path, text=text)
        if _minisign_key_line(lines[1].strip()):
            raise InputError(f"--key {path}: its key line (line 2) has blanks around it, which minisign does not "
                             "take: remove them")
    # a secret key by its armour line or minisign's comment line, not by the words anywhere (a README that
    # mentions secret keys was said to be one)
    if SECRET_ARMOUR_RE.search(text) or lines[0].startswith("untrusted comment:") and "secret key" in lines[0]:
        raise InputError(f"--key {path}: this is a secret key; give the public one")
    if data[:1] and data[0] & 0x80:  # an OpenPGP packet's first byte: gpg --export without --armor, a .gpg keyring
        raise InputError(f"--key {path}: not text, so neither an armoured OpenPGP public key nor a minisign "
                         "public key (a binary OpenPGP key, as gpg --export writes it without --armor: import it "
                         "and give gpg --armor --export KEYID)")
    raise InputError(f"--key {path}: neither an armoured OpenPGP public key (gpg --armor --export) nor a "
                     "minisign public key")


@dataclass(frozen=True, kw_only=True)
class SignatureCheck:
    target: str  # the signature file
    passed: bool
    detail: str
    data: bytes = field(default=b"", repr=False, compare=False)  # the signed file's bytes, as verified
    comment: str = ""  # a good minisign signature's trusted comment
    others: tuple[str, ...] = ()  # the keys of the co-signatures not checked for want of their key (OpenPGP)



def _status(stdout: bytes) -> list[dict[str, list[str]]]:
    """gpgv's ``--status-fd`` lines, one group per signature of the file (each begins with
    ``NEWSIG``), by keyword: the first of each."""
    groups: list[dict[str, list[str]]] = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "[GNUPG:]":
            if not groups or (words[1] == "NEWSIG" and "NEWSIG" in groups[-1]):
                groups.append({})  # (a line before the first NEWSIG is the first signature's)
            groups[-1].setdefault(words[1], words[2:])
    return groups


def _not_given(group: dict[str, list[str]]) -> bool:
    """A signature gpgv could not check for want of its key (``ERRSIG`` with code 9, ``NO_PUBKEY``): a
    co-signer's, whose key was not given."""
    errsig = group.get("ERRSIG", [])
    return len(errsig) >= 6 and errsig[5] == "9" and not ({"GOODSIG", "BADSIG", "VALIDSIG"} & group.keys())


def _signer_of(group: dict[str, list[str]]) -> str:
    """The key of a signature gpgv could not check: its fingerprint when gpgv says it, else its key ID."""
    errsig = group.get("ERRSIG", [])
    return errsig[6] if len(errsig) >= 7 and errsig[6] not in ("", "-") else errsig[0] if errsig else "?"


def _openpgp_keys(key: PublicKey, keyring: Path, home: Path, env: Mapping[str, str]) -> None:
    """The keyring gpgv is given holds one primary key: any key in it makes a good signature, so a
    file that also holds someone else's key would let theirs sign the release. Counted in the
    keyring itself, as ``--dearmor`` made it of every armoured block of the file: ``--show-keys`` on
    the file reads a block headed ``PGP ARMORED FILE`` as no key, and gpgv takes the key in it."""
    shown = _run(["gpg", "--batch", "--homedir", str(home), "--with-colons", "--show-keys", str(keyring)],
                 env, None, f"--key {key.path}")
    count = sum(1 for line in shown.stdout.decode("utf-8", "replace").splitlines() if line.startswith("pub:"))
    if shown.returncode != 0 or count == 0:
        raise InputError(f"--key {key.path}: gpg cannot read it: {_tail(shown)}")
    if count > 1:
        raise InputError(f"--key {key.path}: holds {count} OpenPGP keys; give the publisher's key alone")


MAX_SIGNATURES = 16  # a detached signature holds one signature packet a signer


def _odd_signature(signed: bytes, home: Path, env: Mapping[str, str]) -> str:
    """Why ``signed`` is not what ``gpg --detach-sign`` writes (its packets, at the top level, are signatures, one a
    signer), or "". gpgv checks every signature a file holds, inside a compressed packet too: 100 000 copies of one
    good signature, compressed into 40 kB, kept it busy for minutes (a 1 MiB file, hours), and were all good.
    The packet headers are read by hand (RFC 4880 4.2): no well-kept Python library reads them without taking on
    the whole of OpenPGP, and gpg's own --list-packets unpacks the compressed packet it should refuse unread."""
    data = signed
    if b"-----BEGIN PGP" in signed:
        (home / "signature.armoured").write_bytes(signed)
        out = home / "signature.bin"
        proc = _run(["gpg", "--batch", "--homedir", str(home), "--dearmor", "--output", str(out),
                     str(home / "signature.armoured")], env, None, "verify")
        if proc.returncode != 0:
            return f"its armour cannot be read ({_tail(proc)})"
        data = out.read_bytes()
    at, count, cut = 0, 0, "it is cut short"
    while at < len(data):
        first = data[at]
        if not first & 0x80:
            return f"byte {at} begins no OpenPGP packet"
        if first & 0x40:  # the new format: the tag, then a length of 1, 2 or 5 bytes
            tag = first & 0x3F
            if at + 1 >= len(data):
                return cut
            size = data[at + 1]
            if size < 192:
                head, length = 2, size
            elif size < 224:
                if at + 2 >= len(data):
                    return cut
                head, length = 3, ((size - 192) << 8) + data[at + 2] + 192
            elif size == 255:
                if at + 6 > len(data):
                    return cut
                head, length = 6, int.from_bytes(data[at + 2:at + 6], "big")
            else:
                return "a packet of partial lengths, which no signature has"
        else:  # the old format: the tag, then a length of 1, 2 or 4 bytes
            tag, kind = (first >> 2) & 0x0F, first & 0x03
            if kind == 3:
                return "a packet that runs to the end of the file, which no signature has"
            width = (1, 2, 4)[kind]
            if at + 1 + width > len(data):
                return cut
            head, length = 1 + width, int.from_bytes(data[at + 1:at + 1 + width], "big")
        if tag != 2:
            return f"a packet of type {tag} ({'compressed data' if tag == 8 else 'not a signature'}) at byte {at}"
        count += 1
        if count > MAX_SIGNATURES:
            return f"more than {MAX_SIGNATURES} signatures"
        at += head + length
        if at > len(data):
            return cut
    return "" if count else "no signature in it"


def verify_signature(folder: Path, name: str, key: PublicKey, env: Mapping[str, str], *,
                     limit: int) -> SignatureCheck:
    """``folder/name`` against its detached signature by ``key``: absent or wrong is a failed check.

    Both files are read once, bounded (``limit``: the signed file's), and must be regular files; the tools check copies of those
    bytes, which the check hands back (``data``) so that what is verified is what is then read."""
    signature = folder / (name + key.suffix)
    target = signature.name
    if not os.path.lexists(signature):
        other = name + (MINISIG if key.kind == "openpgp" else ASC)
        if os.path.lexists(folder / other):  # signed, with the other kind of key: said so, not "not signed"
            kind = "minisign" if key.kind == "openpgp" else "OpenPGP"
            return SignatureCheck(target=target, passed=False,
                                  detail=f"missing: {name} has no {key.kind} signature ({key.kind} key {key.path.name} "
                                         f"given); it has {other}: give the publisher's {kind} public key")
        return SignatureCheck(target=target, passed=False,
                              detail=f"missing: {name} is not signed ({key.kind} key {key.path.name} given)")
    if signature.is_symlink() or not signature.is_file():
        # (as verify-release.sh says it: there, and no signature to read; a FIFO is never opened)
        return SignatureCheck(target=target, passed=False, detail="not a regular file (a link?): not a signature")
    with tempfile.TemporaryDirectory(prefix="unibake-verify-") as temp:
        home = Path(temp)
        try:
            data = read_small_file(folder / name, UnibakeError, limit=limit, follow=False)
            signed = read_small_file(signature, UnibakeError, limit=KEY_LIMIT, follow=False)
        except UnibakeError as exc:
            return SignatureCheck(target=target, passed=False, detail=f"not checked: {str(exc)[:200]}")
        (home / "signed").write_bytes(data)
        (home / "signature").write_bytes(signed)
        if key.kind == "openpgp":
            keyring = home / "publisher.gpg"
            dearmor = _run(["gpg", "--batch", "--homedir", str(home), "--dearmor", "--output", str(keyring),
                            str(key.path.resolve())], env, None, f"--key {key.path}")
            if dearmor.returncode != 0:
                raise InputError(f"--key {key.path}: gpg cannot read it: {_tail(dearmor)}")
            _openpgp_keys(key, keyring, home, env)
            odd = _odd_signature(signed, home, env)
            if odd:
                return SignatureCheck(target=target, passed=False, detail=f"BAD: not a detached signature: {odd}")
            proc = _run(["gpgv", "--homedir", str(home), "--status-fd", "1", "--keyring", str(keyring),
                         str(home / "signature"), str(home / "signed")], env, None, "verify")
            groups = _status(proc.stdout)
            # gpgv exits 0 for a revoked key's signature too: the status lines say what it was
            if any("REVKEYSIG" in g for g in groups):
                return SignatureCheck(target=target, passed=False,
                                      detail=f"BAD: made by a key that has been revoked ({key.path.name})")
            if any("EXPSIG" in g for g in groups):
                return SignatureCheck(target=target, passed=False, detail="BAD: the signature has expired")
            # a file co-signed by a key not given: gpgv exits 2 for that signature alone; the given
            # key's good, and every other one only unchecked for want of its key, passes
            good = [g for g in groups if g.get("VALIDSIG") and ("GOODSIG" in g or "EXPKEYSIG" in g)]
            others = [g for g in groups if g not in good]
            if good and all(_not_given(g) for g in others) and (proc.returncode == 0 or others):
                valid = good[0]["VALIDSIG"]
                primary = valid[9] if len(valid) >= 10 else valid[0]  # a subkey's signature names its primary key
                since = " (the key has expired: ask the publisher)" if "EXPKEYSIG" in good[0] else ""
                also = f"; {len(others)} more by keys not given, not checked" if others else ""
                return SignatureCheck(target=target, passed=True, data=data,
                                      detail=f"good OpenPGP signature by {primary}{since}{also}",
                                      others=tuple(_signer_of(g) for g in others))
            return SignatureCheck(target=target, passed=False,
                                  detail=f"BAD: not a valid signature of {name} by {key.path.name} ({_tail(proc)})")
        proc = _run(["minisign", "-V", "-p", str(key.path.resolve()), "-m", str(home / "signed"),
                     "-x", str(home / "signature")], env, None, "verify")
        if proc.returncode == 0:
            comments = [line[len("Trusted comment: "):] for line in proc.stdout.decode("utf-8", "replace").splitlines()
                        if line.startswith("Trusted comment: ")]
            said = f", trusted comment {comments[0][:120]!r}" if comments else ""
            return SignatureCheck(target=target, passed=True, data=data, comment=comments[0] if comments else "",
                                  detail=f"good minisign signature by {minisign_key_id(key.text)}{said}")
        reason = _tail(proc) if proc.stderr.strip() else (proc.stdout.decode("utf-8", "replace").strip()[:200]
                                                           or f"exit {proc.returncode}")
        # minisign names the files it was given: the copies in the temporary folder, shown as the release's
        reason = reason.replace(str(home / "signature"), target).replace(str(home / "signed"), name)
        reason = reason.replace("\n", " ")  # its key-id mismatch is two lines on stdout: one line here
        return SignatureCheck(target=target, passed=False,
                              detail=f"BAD: not a valid signature of {name} by {key.path.name} ({reason})")
