"""``build.py verify DIR``: what a downloader runs on a release folder.

One read of the archive does everything: each file's sha256 (against SHA256SUMS and the manifest),
the zstd frames' integrity (their checksums), the uncompressed stream's sha256, and the tar parsed
on the fly with every layer's diffID and the config digest recomputed against ``manifest.json``.
With ``--load`` the archive is then loaded into an engine and the image ID compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from .archive_reader import ArchiveReader
from .engine import Engine, LoadOutcome
from .errors import ArchiveError, InputError, VerificationError, ZstdDecodeError
from .files import decode_text, read_small_file, read_small_text, visible_name
from .imagetar import ZSTD_MAGIC, check_against, check_release_form, interpret, read_members
from .manifest import (FILE_NAME_PATTERN, MANIFEST, MAX_MANIFEST_BYTES, NOT_IN_FORM, ReleaseManifest, off_form,
                       parse_manifest, read_json)
from .platforms import recorded_by
from .publish import SUMS, SUMS_LIMIT
from .sums import parse_sums
from .threads import counted

IMAGE_ID = "IMAGE_ID"

PLAIN_NAME_RE = re.compile(FILE_NAME_PATTERN)  # a file of the folder itself; verify-release.sh uses the same rule


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str  # sha256 | size | zstd | structure | load | external
    target: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Report:
    """Every check made on a release folder, in order, and the manifest they were made against."""

    folder: Path
    checks: tuple[Check, ...]
    manifest: ReleaseManifest | None
    signed_sums: bytes | None = None  # SHA256SUMS as its signature was checked: what verify_folder reads then
    comments: tuple[tuple[str, str, str], ...] = ()  # (signature, the file it signs, its minisign trusted comment)
    cosigners: tuple[str, ...] = ()  # the keys of SHA256SUMS's co-signatures by keys not given, not checked

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def raise_if_failed(self) -> None:
        failed = self.failures
        if failed:
            first = failed[0]
            more = f" (and {len(failed) - 1} more failed checks)" if len(failed) > 1 else ""
            raise VerificationError(f"{first.target}: {first.name} check failed: {first.detail}{more}")

    def document(self) -> dict:
        """The report as ``--json`` prints it."""
        return {"folder": str(self.folder), "passed": not self.failures,
                "image_id": self.manifest.image_id if self.manifest else None,
                "tag": self.manifest.tag if self.manifest else None,
                "checks": [{"check": c.name, "target": c.target, "passed": c.passed, "detail": c.detail}
                           for c in self.checks]}


class _Checks(list):
    def add(self, name: str, target: str, passed: bool, detail: str = "") -> bool:
        self.append(Check(name=name, target=target, passed=passed, detail=detail))
        return passed


def read_sums(folder: Path, data: bytes | None = None) -> dict[str, str]:
    """``SHA256SUMS`` of a release folder, by name: plain file names only. ``data``: its bytes as
    its signature was checked (read once: a file swapped after the check is not read)."""
    path = folder / SUMS
    if data is None:
        text = read_small_text(path, VerificationError, limit=SUMS_LIMIT,
                               what="this is not a complete release folder", follow=False)
    else:
        text = decode_text(data, path, VerificationError)
    sums = {}
    for entry in parse_sums(text, str(path), VerificationError):
        if not PLAIN_NAME_RE.fullmatch(entry.name) or entry.name in (".", ".."):
            raise VerificationError(f"{path}:{entry.line}: {entry.name[:80]!r} is not a file of this folder")
        sums[entry.name] = entry.sha256
    if not sums:
        raise VerificationError(f"{path}: lists nothing; this is not a complete release folder")
    return sums


def _sha256_of(path: Path, advance: Callable[[int], object] = lambda n: None) -> str | None:
    """The sha256 of a regular file in the folder; None for anything else (a link, a FIFO, a folder).
    ``advance`` is told each block read (a release's archive: gigabytes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen: it refuses a folder ("3: Is a directory")
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        digest = hashlib.sha256()
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            advance(len(block))
        return digest.hexdigest()


def check_sums(folder: Path, sums: dict[str, str], checks: _Checks | None = None,
               advance: Callable[[int], object] = lambda n: None) -> _Checks:
    """What ``sha256sum -c`` checks, for the files named in ``sums`` (``advance`` told the bytes read)."""
    checks = checks if checks is not None else _Checks()
    for name in sorted(sums):
        path = folder / name
        if not os.path.lexists(path):
            checks.add("sha256", name, False, "missing (listed in SHA256SUMS)")
            continue
        digest = _sha256_of(path, advance)
        if digest is None:
            checks.add("sha256", name, False, "not a regular file")
            continue
        ok = digest == sums[name]
        checks.add("sha256", name, ok, "" if ok else "differs from SHA256SUMS")
    return checks


def _check_image_id_file(folder: Path, sums: dict[str, str], image_id: str, checks: _Checks) -> None:
    """``IMAGE_ID``, what the downloaders' guide compares ``docker load``'s answer with, must be listed
    and name the image the manifest does (its bytes are checked against SHA256SUMS above)."""
    if IMAGE_ID not in sums:
        checks.add("image id", IMAGE_ID, False, "not listed in SHA256SUMS")
        return
    path = folder / IMAGE_ID
    try:
        text = read_small_text(path, VerificationError, limit=1024, follow=False)
    except VerificationError as exc:
        if path.is_file() and not path.is_symlink():  # too large, not UTF-8: it names no image (as the shell's)
            checks.add("image id", IMAGE_ID, False, f"{str(exc)[:200]}: does not hold an image ID")
        return  # missing or not a regular file: the sha256 check above has said so
    # read as the guide's `test "$(docker image inspect ...)" = "$(cat IMAGE_ID)"` reads it (and the shell
    # verifier): trailing newlines dropped, nothing else (a space, a carriage return would fail that test)
    named = text.rstrip("\n")
    ok = named == image_id
    checks.add("image id", IMAGE_ID, ok, image_id[:19] + "..., as manifest.json" if ok else
               f"names {named[:80]!r}, but {MANIFEST} says {image_id}")


def _check_validation_size(folder: Path, sums: Mapping[str, str], checks: _Checks) -> None:
    """A listed ``VALIDATION.json`` is read (whether its smoke gates ran, warned of) up to the limit the
    manifest's read has, as the shell verifier reads it: one past it is no release's, and would go unread
    (its warning unsaid) here while the shell verifier refuses it."""
    from .manifest import VALIDATION

    if VALIDATION not in sums:
        return
    try:
        info = os.lstat(folder / VALIDATION)
    except OSError:
        return  # missing: its sha256 check said so
    if stat.S_ISREG(info.st_mode) and info.st_size > MAX_MANIFEST_BYTES:
        checks.add("size", VALIDATION, False, f"{info.st_size} bytes, more than the {MAX_MANIFEST_BYTES} a "
                   f"release's {VALIDATION} may be: not read")


def _check_unlisted(folder: Path, sums: Mapping[str, str], archive_name: str, checks: _Checks) -> None:
    """Files of the folder that SHA256SUMS does not list. One named like the archive (a part added
    after the release was signed: ``NAME.part-+``) fails: whoever loads the parts by a pattern would
    load it too. Any other (a ``publisher.pub`` saved beside the release, as the guide says) is
    named, not read."""
    unsigned = {SUMS, SUMS + ".asc", SUMS + ".minisig"}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if name in sums or name in unsigned:
            continue
        shown = visible_name(name)
        if name.startswith(archive_name):
            checks.add("listed", shown, False, "named like the archive, but SHA256SUMS does not list it: nothing "
                       "vouches for it (a part added after the release was made?); remove it")
        else:
            checks.add("listed", shown, True, "not listed in SHA256SUMS: not part of the release, not read")


def trusted_manifest(folder: Path, signed_sums: bytes | None = None) -> ReleaseManifest:
    """A release's manifest, checked against its SHA256SUMS first (for commands that need the
    manifest and not the archive: pull, deploy, kit). ``signed_sums``: SHA256SUMS as its signature
    was checked."""
    sums = read_sums(folder, signed_sums)
    if MANIFEST not in sums:
        raise VerificationError(f"{folder}/{MANIFEST}: not listed in SHA256SUMS; this is not a complete release folder")
    data = _manifest_bytes(folder)
    if hashlib.sha256(data).hexdigest() != sums[MANIFEST]:
        raise VerificationError(f"{folder}/{MANIFEST}: differs from SHA256SUMS; the folder cannot be trusted")
    return parse_manifest(decode_text(data, folder / MANIFEST, VerificationError), str(folder / MANIFEST))


def _manifest_bytes(folder: Path) -> bytes:
    """``manifest.json`` read once: the bytes whose sha256 is checked are the ones parsed (a second
    read could find another file)."""
    return read_small_file(folder / MANIFEST, VerificationError, limit=MAX_MANIFEST_BYTES,
                           what="this is not a complete release folder", follow=False)


# the line VALIDATION.json (json.dumps, indent 2) gives the reason no smoke gate ran on: a top-level
# "smoke_skipped" holding a JSON string (null when the gates ran); verify-release.sh reads the same line
SMOKE_SKIPPED_LINE = re.compile(r'^  "smoke_skipped": ("(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"),?$',
                                re.MULTILINE)


def gates_not_run(folder: Path, signed_sums: bytes | None = None) -> str | None:
    """Why no smoke gate of a release ran (``--no-smoke``, ``--no-roundtrip``), as its ``VALIDATION.json``
    says; None when they ran or it does not say. Only a VALIDATION.json that SHA256SUMS lists, read once
    (the bytes whose sha256 is compared are the ones read), and its first ``smoke_skipped`` line as
    json.dumps writes it: read as ``scripts/verify-release.sh`` reads it, so that both warn alike."""
    from .manifest import VALIDATION

    try:
        sums = read_sums(folder, signed_sums)
        data = read_small_file(folder / VALIDATION, VerificationError, limit=MAX_MANIFEST_BYTES, follow=False)
    except VerificationError:
        return None
    if sums.get(VALIDATION) != hashlib.sha256(data).hexdigest():
        return None
    found = SMOKE_SKIPPED_LINE.search(data.decode("utf-8", errors="replace"))
    if found is None:
        return None
    return " ".join(json.loads(found.group(1)).split())[:300] or None


def _check_listed_as_recorded(f, sums: Mapping[str, str], checks: _Checks) -> None:
    """A file of the archive (``ArchiveFile``) is listed in SHA256SUMS with the sha256 manifest.json, which
    SHA256SUMS holds, records for it."""
    if f.name not in sums:
        checks.add("sha256", f.name, False, "not listed in SHA256SUMS")
    elif sums[f.name] != f.sha256:
        checks.add("sha256", f.name, False, f"{MANIFEST} records the sha256 {f.sha256}; SHA256SUMS lists "
                   f"{sums[f.name]}")


def sums_report(folder: Path, manifest: ReleaseManifest) -> Report:
    """``releases``' quick look: what ``sha256sum -c SHA256SUMS`` checks, and that SHA256SUMS lists
    what makes the release (``manifest.json``, every file of the archive, ``IMAGE_ID`` naming its
    image): a folder whose sums leave the archive out does not verify, even at a glance."""
    sums = read_sums(folder)
    checks = check_sums(folder, sums)
    if MANIFEST not in sums:
        checks.add("sha256", MANIFEST, False, "not listed in SHA256SUMS")
    for f in manifest.archive.files:
        # (another archive, re-summed in SHA256SUMS alone, passed sha256sum -c here: "verifies")
        _check_listed_as_recorded(f, sums, checks)
    _check_image_id_file(folder, sums, manifest.image_id, checks)
    _check_unlisted(folder, sums, manifest.archive.name, checks)
    return Report(folder=folder, checks=tuple(checks), manifest=None)


def verify_folder(folder: Path, signed_sums: bytes | None = None, progress: Callable | None = None) -> Report:
    """Sums, sizes, zstd integrity and structure of a release folder; never raises for a bad file.
    ``signed_sums``: SHA256SUMS as its signature was checked. ``progress(description, total)``: a
    context manager giving the byte counter of the archive's read (a console's), for a big archive."""
    checks = _Checks()
    sums = read_sums(folder, signed_sums)
    if MANIFEST not in sums:
        raise VerificationError(f"{folder}/{MANIFEST}: not listed in SHA256SUMS; this is not a complete release folder")
    data = _manifest_bytes(folder)
    manifest_ok = hashlib.sha256(data).hexdigest() == sums[MANIFEST]
    if not checks.add("sha256", MANIFEST, manifest_ok, "" if manifest_ok else "differs from SHA256SUMS"):
        raise VerificationError(f"{MANIFEST}: sha256 differs from SHA256SUMS; the folder cannot be trusted")
    manifest = parse_manifest(decode_text(data, folder / MANIFEST, VerificationError), str(folder / MANIFEST))
    archive = manifest.archive
    parts = [f.name for f in archive.files]
    check_sums(folder, {n: d for n, d in sums.items() if n not in parts and n != MANIFEST}, checks)
    _check_image_id_file(folder, sums, manifest.image_id, checks)
    _check_validation_size(folder, sums, checks)
    # named as unibake names a release's archive, as its notes and README-DIST load it (the shell verifier checks it)
    named = f"{manifest.product}-{manifest.release}.tar.zst"
    if archive.name != named:
        checks.add("archive", MANIFEST, False, f"its archive is named {archive.name}, not {named}, as unibake names "
                   f"the archive of release {manifest.release}")
    _check_unlisted(folder, sums, archive.name, checks)
    for name in sorted(sums):
        if (name == archive.name or name.startswith(archive.name + ".part-")) and name not in parts:
            # whoever loads the parts by a pattern (the shell verifier too) would read it
            checks.add("listed", visible_name(name), False, f"named like the archive, but {MANIFEST} does not "
                       "record it as one of its files: not one release's archive; remove it")

    readable, on_disk = True, 0
    for f in archive.files:
        path = folder / f.name
        _check_listed_as_recorded(f, sums, checks)  # (the file is read against SHA256SUMS's below)
        if not path.is_file() or path.is_symlink():
            part = " part" if len(parts) > 1 else ""
            what = f"missing{part}" if not os.path.lexists(path) else f"a{part or ' file'} that is not a regular file"
            checks.add("size", f.name, False, f"{what} (listed in manifest.json)")
            readable = False
            continue
        size = path.stat().st_size
        on_disk += size
        if size < f.bytes:
            checks.add("size", f.name, False, f"truncated: {size} of {f.bytes} bytes")
        elif size > f.bytes:
            checks.add("size", f.name, False, f"{size} bytes, {size - f.bytes} more than the {f.bytes} recorded")
        else:
            checks.add("size", f.name, True, f"{size} bytes")
    if archive.bytes != sum(f.bytes for f in archive.files):
        checks.add("size", archive.name, False, f"{MANIFEST} records the archive as {archive.bytes} bytes; its files "
                   f"make {sum(f.bytes for f in archive.files)}")
    if not readable:
        checks.add("structure", archive.name, False, "not checked: a file of the archive is missing or not a "
                   "regular file")
        return Report(folder=folder, checks=tuple(checks), manifest=manifest)

    # the archive's read is the long part (hashing and decoding every byte): counted in compressed bytes,
    # as the files are read, so that a file zstd refuses at once (read to its end for its digest) shows too
    shown = progress("read archive", on_disk) if progress is not None else nullcontext(lambda n: None)
    with shown as advance:
        reader = ArchiveReader(folder, parts, progress=advance, limit=archive.uncompressed_bytes)
        zstd_ok, structure = True, ""
        try:
            omitted = frozenset(manifest.hotfix.omitted_diff_ids) if manifest.hotfix else frozenset()
            members = read_members(reader.chunks())
            saved = interpret(members, omitted)
            check_against(saved, image_id=manifest.image_id, diff_ids=manifest.diff_ids, what=MANIFEST)
            check_release_form(members, manifest.tag)
            if recorded_by(saved.config) != (manifest.platform or ""):
                structure = (f"the image config is for {recorded_by(saved.config) or 'no platform'}, but {MANIFEST} "
                             f"says {manifest.platform}")
        except ZstdDecodeError as exc:
            zstd_ok, structure = False, str(exc)
        except ArchiveError as exc:
            structure = str(exc)
        finally:
            reader.finish()
    if not structure and reader.decoded.hexdigest() != archive.uncompressed_sha256:
        structure = "the uncompressed stream's sha256 differs from manifest.json"
    if not structure and reader.decoded_bytes != archive.uncompressed_bytes:
        structure = (f"the uncompressed stream is {reader.decoded_bytes} bytes; {MANIFEST} records "
                     f"{archive.uncompressed_bytes}")
    digests = reader.file_sha256()
    for name in parts:
        if name in sums:
            ok = digests[name] == sums[name]
            checks.add("sha256", name, ok, "" if ok else "differs from SHA256SUMS")
    if reader.whole.hexdigest() != archive.sha256:
        checks.add("sha256", archive.name + (" (all parts)" if len(parts) > 1 else ""), False,
                   "differs from manifest.json")
    checks.add("zstd", archive.name, zstd_ok, "frames and their checksums" if zstd_ok else structure)
    if zstd_ok:
        checks.add("structure", archive.name, not structure, structure or
                   f"config {manifest.image_id[:19]}... and {len(manifest.diff_ids)} diffIDs recomputed")
    check_attachments(folder, manifest, sums, checks)
    check_supply_chain(folder, manifest, sums, checks)
    return Report(folder=folder, checks=tuple(checks), manifest=manifest)


def check_attachments(folder: Path, manifest: ReleaseManifest, sums: dict[str, str], checks: _Checks) -> None:
    """Each attachment manifest.json records (a file of the project copied into the release, which the notes
    list) is a file SHA256SUMS lists with its sha256, of its size, named as unibake lets an attachment be
    named (not a file of the release itself, its signature or a .tar.zst; one name once, letter case aside).
    verify-release.sh checks the same. (A record of a file not there, or of the SBOM, passed both.)"""
    from .notes import _taken

    seen: set[str] = set()
    for n, a in enumerate(manifest.attachments):
        if _taken(a.name) or a.name.casefold() in seen:
            if a.name.casefold() in seen:
                why = "as another attachment does (letter case aside)"
            else:
                why = "which an attachment cannot be named (a file of the release itself, a signature or a .tar.zst)"
            checks.add("attachment", MANIFEST, False, f"its attachments.{n} names {a.name}, {why}")
            continue
        seen.add(a.name.casefold())
        if sums.get(a.name) != a.sha256:
            checks.add("sha256", a.name, False, f"not listed in SHA256SUMS ({MANIFEST} records it as an attachment)"
                       if a.name not in sums else f"SHA256SUMS and {MANIFEST} disagree")
            continue
        try:
            info = os.lstat(folder / a.name)
        except OSError:
            continue  # its sha256 check said so
        if stat.S_ISREG(info.st_mode) and info.st_size != a.bytes:
            checks.add("size", a.name, False, f"{info.st_size} bytes, but {MANIFEST} records {a.bytes}")


def check_supply_chain(folder: Path, manifest: ReleaseManifest, sums: dict[str, str], checks: _Checks) -> None:
    """The SBOM's and the provenance's subjects against the release; their files against the
    manifest. (Their bytes are checked against SHA256SUMS with every other file.)"""
    from .kit import kit_name
    from .provenance import PROVENANCE, PROVENANCE_LIMIT, check_subjects, parse_provenance
    from .sbom import SBOM, SBOM_LIMIT, check_sbom

    record = manifest.supply_chain
    # a supply-chain file SHA256SUMS lists that the record leaves out would be checked by nothing (its
    # record, null or dropped, and SHA256SUMS re-summed: an SBOM of another image shipped as the release's)
    recorded = {"sbom": record.sbom, "provenance": record.provenance, "kit": record.kit} if record else {}
    for what, label, name in (("sbom", "SBOM", SBOM), ("provenance", "provenance", PROVENANCE),
                              ("kit", "kit", kit_name(manifest.product, manifest.release))):
        if name in sums and recorded.get(what) is None:
            checks.add(what, name, False, f"listed in SHA256SUMS, but {MANIFEST} records no {label} "
                       f"(supply_chain.{what}): nothing checks it against the release")
    if record is None:
        return
    files = [record.sbom, record.provenance] + ([record.kit] if record.kit else [])
    _check_supply_names(folder, manifest, sums, checks)
    for f in files:
        if sums.get(f.name) != f.sha256:
            checks.add("sha256", f.name, False, "not listed in SHA256SUMS" if f.name not in sums else
                       "SHA256SUMS and manifest.json disagree")
            continue
        # its size too, as the archive's files' (a record whose sha256 is the file's and whose bytes are not
        # is not the file's record); a file missing or not a regular one failed its sha256 check above
        try:
            info = os.lstat(folder / f.name)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size != f.bytes:
            checks.add("size", f.name, False, f"{info.st_size} bytes, but {MANIFEST} records {f.bytes}")
    texts = {}
    for f, limit in ((record.sbom, SBOM_LIMIT), (record.provenance, PROVENANCE_LIMIT)):
        what = "sbom" if f is record.sbom else "provenance"
        # read once: the bytes hashed against SHA256SUMS here are the bytes parsed (the sums check above
        # read the file before: one swapped since would otherwise be parsed unchecked), as the shell reads a copy
        try:
            data = read_small_file(folder / f.name, VerificationError, limit=limit, follow=False)
            text = decode_text(data, folder / f.name, VerificationError)
        except VerificationError as exc:
            checks.add(what, f.name, False, str(exc))
            continue
        if f.name in sums and hashlib.sha256(data).hexdigest() != sums[f.name]:
            checks.add(what, f.name, False, f"{f.name}: changed after its sha256 was checked (it no longer has the "
                       "sha256 SHA256SUMS lists): refused")
            continue
        # in the one form unibake writes (as manifest.json): the shell verifier reads it line by line
        try:
            odd = off_form(text, read_json(text))
        except (ValueError, RecursionError) as exc:
            checks.add(what, f.name, False, f"{f.name}: not valid JSON ({str(exc)[:80]})")
            continue
        if odd:
            checks.add(what, f.name, False, f"{f.name}: {odd}: {NOT_IN_FORM}")
            continue
        texts[f.name] = text
    if record.sbom.name in texts:
        problems = check_sbom(texts[record.sbom.name], image_id=manifest.image_id, where=record.sbom.name)
        checks.add("sbom", record.sbom.name, not problems, problems[0] if problems else
                   f"CycloneDX; its subject is {manifest.image_id[:19]}...")
    if record.provenance.name in texts:
        try:
            document = parse_provenance(texts[record.provenance.name], record.provenance.name)
            required = tuple(f.name for f in manifest.archive.files) + tuple(f.name for f in files[:1] + files[2:])
            problems = check_subjects(document, files=sums, image_ref=manifest.tag, image_id=manifest.image_id,
                                      required=required, where=record.provenance.name)
        except VerificationError as exc:
            problems = [str(exc)]
        checks.add("provenance", record.provenance.name, not problems, problems[0] if problems else
                   f"in-toto SLSA v1; {len(required) + 1} subjects match the release")
    for signature in record.signatures:
        for name in signature.files:
            present = (folder / name).is_file() and not (folder / name).is_symlink()
            if not present:
                checks.add("signature", name, False, f"missing ({signature.kind} signature by {signature.key})")


def _check_supply_names(folder: Path, manifest: ReleaseManifest, sums: Mapping[str, str], checks: _Checks) -> None:
    """Each supply_chain entry holds its own file, as unibake names and writes it (verify-release.sh checks
    the same): the SBOM, the provenance, the kit of this product and release (a zstd stream, not a copy of
    another listed file), and each kind's signatures of SHA256SUMS and the provenance, one record a kind.
    Another listed file recorded there (the SBOM as the kit, the archive as the kit) passed every other check."""
    from .kit import kit_name
    from .provenance import PROVENANCE
    from .sbom import SBOM
    from .signing import ASC, MINISIG

    record = manifest.supply_chain
    assert record is not None
    wanted = [("sbom", "SBOM", record.sbom, SBOM), ("provenance", "provenance", record.provenance, PROVENANCE)]
    if record.kit is not None:
        wanted.append(("kit", "kit", record.kit, kit_name(manifest.product, manifest.release)))
    for what, label, f, want in wanted:
        if f.name != want:
            checks.add(what, MANIFEST, False, f"its supply_chain.{what} names {f.name}, not the release's {label} "
                       f"({want})")
    kit = record.kit
    if kit is not None and kit.name == wanted[-1][3]:
        same = sorted(n for n, d in sums.items() if d == kit.sha256 and n != kit.name)
        head = None  # missing, or not a regular file: its sha256 check says so
        try:
            fd = os.open(folder / kit.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            with os.fdopen(fd, "rb") as fh:
                if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    head = fh.read(len(ZSTD_MAGIC))
        if same:
            checks.add("kit", kit.name, False, f"the same bytes as {same[0]} (SHA256SUMS): not the release's kit")
        elif head is not None and head != ZSTD_MAGIC:
            checks.add("kit", kit.name, False, "does not start as a zstd stream, as the release's kit does: not its "
                       "kit")
    kinds: set[str] = set()
    for n, signature in enumerate(record.signatures):
        suffix = ASC if signature.kind == "openpgp" else MINISIG
        want = (SUMS + suffix, PROVENANCE + suffix)
        if signature.kind in kinds:
            checks.add("signature", MANIFEST, False, f"its supply_chain.signatures.{n} is a second {signature.kind} "
                       "record (unibake signs with one key of each kind)")
        elif signature.files != want:
            checks.add("signature", MANIFEST, False, f"its supply_chain.signatures.{n} ({signature.kind}) names "
                       f"{', '.join(signature.files) or 'no file'}, not {want[0]} and {want[1]}")
        kinds.add(signature.kind)


def verify_signatures(folder: Path, key_path: Path, env: Mapping[str, str]) -> Report:
    """``SHA256SUMS`` (and the provenance, when signed) against the publisher's key: the first
    check of ``verify --key``; absent or wrong is a failed check, and nothing else is trusted."""
    from .provenance import PROVENANCE, PROVENANCE_LIMIT
    from .signing import read_public_key, verify_signature

    key = read_public_key(key_path)
    checks = _Checks()
    comments = []
    first = verify_signature(folder, SUMS, key, env, limit=SUMS_LIMIT)
    checks.add("signature", first.target, first.passed, first.detail)
    comments.append((first.target, SUMS, first.comment))
    if first.passed and (folder / (PROVENANCE + key.suffix)).is_file():
        second = verify_signature(folder, PROVENANCE, key, env, limit=PROVENANCE_LIMIT)
        checks.add("signature", second.target, second.passed, second.detail)
        comments.append((second.target, PROVENANCE, second.comment))
    return Report(folder=folder, checks=tuple(checks), manifest=None,
                  signed_sums=first.data if first.passed else None,
                  comments=tuple(c for c in comments if c[2]), cosigners=first.others)


# the trusted comment unibake signs with: "PRODUCT RELEASE FILE", FILE one it signs (another, a
# publisher's own such as "signed by ops", is shown only)
UNIBAKE_COMMENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63} [A-Za-z0-9_][A-Za-z0-9_.-]{0,127} "
                                r"(SHA256SUMS|provenance\.intoto\.json)")


def comment_checks(signed: Report, manifest: ReleaseManifest) -> list[Check]:
    """A minisign trusted comment in unibake's form must name the release the manifest is, and the
    file it signs: a signature made for another release (the same key, a comment saying 2.0 on
    1.0's sums) would otherwise be shown as that release's."""
    out = []
    for target, name, comment in signed.comments:
        if not UNIBAKE_COMMENT_RE.fullmatch(comment):
            continue
        want = f"{manifest.product} {manifest.release} {name}"
        ok = comment == want
        out.append(Check(name="signature", target=target, passed=ok, detail=(
            f"its trusted comment names {manifest.product} {manifest.release}, as {MANIFEST}" if ok else
            f"its trusted comment says {comment!r}, but this is {want!r} ({MANIFEST}): a signature made for another "
            "release or file")))
    return out


def check_signed(folder: Path, key_path: Path, env: Mapping[str, str]) -> tuple[bytes, ReleaseManifest]:
    """``--key`` of a command that reads a release's manifest and not its archive (kit): the
    signatures as ``verify --key`` checks them, and their trusted comments against the manifest;
    returns SHA256SUMS as it was checked and the manifest. Raises the first failed check."""
    signed = verify_signatures(folder, key_path, env)
    signed.raise_if_failed()
    assert signed.signed_sums is not None
    manifest = trusted_manifest(folder, signed.signed_sums)
    Report(folder=folder, checks=tuple(comment_checks(signed, manifest)), manifest=manifest).raise_if_failed()
    return signed.signed_sums, manifest


def with_signatures(signed: Report | None, report: Report) -> Report:
    """A folder's report with the signature checks first (and its trusted comments against its manifest)."""
    if signed is None:
        return report
    compared = tuple(comment_checks(signed, report.manifest)) if report.manifest is not None else ()
    return Report(folder=report.folder, checks=signed.checks + compared + report.checks, manifest=report.manifest)


def load_and_compare(report: Report, engine: Engine, progress: Callable[[int], object] = lambda n: None) -> Report:
    """Load the verified archive into ``engine`` and compare the image ID with the manifest's."""
    manifest = report.manifest
    assert manifest is not None
    checks = _Checks(report.checks)
    image_id, hotfix = manifest.image_id, manifest.hotfix
    if (named := engine.inspect_image(manifest.tag)) is not None and named.id != image_id:
        # checked first: an engine holding the release's image under another name still runs this
        # tag's image (run.sh goes by tag), as the shell verifier says too
        checks.add("load", manifest.tag, False, f"the engine's {manifest.tag} is {named.id}, another image: loading "
                   "would move that tag (nothing was loaded)")
    elif named is not None:
        checks.add("load", manifest.tag, True, f"the engine already has {image_id} as {manifest.tag}; not loaded "
                   "again")
    elif engine.inspect_image(image_id) is not None:  # under another name: the same image (its ID is its config's digest)
        engine.tag(image_id, manifest.tag)
        checks.add("load", manifest.tag, True, f"the engine already has {image_id}; tagged {manifest.tag}, not "
                   "loaded again")
    elif hotfix and engine.inspect_image(hotfix.base_image_id) is None:  # only a load needs it: the image may be
        # there already (pulled whole from a registry, or its base removed after the hotfix was applied)
        checks.add("load", manifest.tag, False, f"this hotfix needs image {hotfix.base_image_id} "
                   f"({hotfix.base_tag}) in the engine; load release {hotfix.base_release} first "
                   "(nothing was loaded)")
    else:
        try:
            problem = checked_load(engine, report.folder, manifest, lambda chunks: counted(chunks, progress))
        except (VerificationError, ZstdDecodeError) as exc:
            checks.add("load", manifest.tag, False, f"{exc} (nothing was loaded)")
            return Report(folder=report.folder, checks=tuple(checks), manifest=manifest)
        checks.add("load", manifest.tag, not problem, problem or f"loaded as {image_id}")
    return Report(folder=report.folder, checks=tuple(checks), manifest=manifest)


def checked_load(engine: Engine, folder: Path, manifest: ReleaseManifest,
                 feed: Callable[[Iterator[bytes]], Iterable[bytes]] = lambda chunks: chunks,
                 stop: threading.Event | None = None) -> str:
    """Load the release's archive (checked before) into ``engine``: its stream hashed as it goes and
    its last piece held back until the hash is the manifest's (raises VerificationError, the engine
    refusing the load cut short, when it is not), and a load that brought another image, or tagged
    more than the release's tag, undone. Returns "" when the engine holds the release's image under
    its tag, else what it loaded instead (put back). ``feed`` wraps the stream (progress, an interrupt); ``stop``
    set breaks the load off, its answer too (HandoffAborted)."""
    before = {tag: i.id for i in engine.list_images() for tag in i.tags}
    reader = ArchiveReader(folder, [f.name for f in manifest.archive.files],
                           limit=manifest.archive.uncompressed_bytes)
    stream = feed(_as_checked(reader, manifest.archive.sha256))
    outcome = engine.load(stream, stop=stop) if stop is not None else engine.load(stream)
    loaded = engine.inspect_image(manifest.tag)
    if loaded is not None and loaded.id == manifest.image_id and set(outcome.tags) <= {manifest.tag}:
        return ""
    _undo_load(engine, outcome, before, manifest.tag)
    return (f"the engine loaded {loaded.id if loaded else 'nothing under that tag'} "
            f"({'; '.join(outcome.messages)[:300]}); what the load tagged was put back")


def _as_checked(reader: ArchiveReader, sha256: str) -> Iterator[bytes]:
    """The archive's decoded stream for a load, its last chunk held back until the whole read hashed
    as the check's did: read otherwise, the stream ends in an error instead, and an engine refuses a
    load cut short whole (it unpacks a load before it adds an image)."""
    held = None
    for chunk in reader.chunks():
        if held is not None:
            yield held
        held = chunk
    reader.finish()
    if reader.whole.hexdigest() != sha256:
        raise VerificationError("the archive changed after it was checked (its sha256 is no longer the one "
                                f"{MANIFEST} records)")
    if held is not None:
        yield held


def _undo_load(engine: Engine, outcome: LoadOutcome, before: dict[str, str], tag: str) -> None:
    """A load that loaded another image than the release's: each tag it set back where it was (or
    removed, with the image it named when the engine held that image under no other name)."""
    added: set[str] = set()
    for ref in sorted(set(outcome.tags) | {tag}):
        now = engine.inspect_image(ref)
        if now is None or before.get(ref) == now.id:
            continue
        if now.id not in before.values():
            added.add(now.id)
        if ref in before:
            engine.tag(before[ref], ref)
        elif now.id in before.values() or len(now.tags) > 1:
            engine.untag(ref)
        else:
            engine.remove_image(ref)
    for image in sorted(added):  # what the load added, left with no name
        left = engine.inspect_image(image)
        if left is not None and not left.tags:
            engine.remove_image(image)


def check_external(report: Report, paths: list[Path]) -> Report:
    """Your copies of the artifacts the release records but does not ship, against their size and sha256:
    each path is a file (matched by name) or a folder that holds them under their recorded names."""
    manifest = report.manifest
    assert manifest is not None
    checks = _Checks(report.checks)
    records = {e.name: e for e in manifest.external}
    if not records:
        raise InputError(f"{report.folder}: this release records no external artifacts; --external has nothing to "
                         "check")
    for path in paths:
        if not path.exists():
            raise InputError(f"--external {path}: no such file or folder")
        if path.is_dir():
            pairs = [(e, path / e.name) for e in records.values()]
        else:
            found = [e for e in records.values() if e.name == path.name or e.name.rsplit("/", 1)[-1] == path.name]
            if not found:
                checks.add("external", path.name, False, f"not an artifact of this release; it records "
                           f"{', '.join(sorted(records))}")
                continue
            # artifacts of one file name in several folders (tp1/model.bin, tp2/model.bin): the one whose
            # whole name the path ends with, the longest (w/tp2/model.bin: tp2/model.bin, not model.bin),
            # else whichever the copy is (it is checked against each)
            named = sorted((e for e in found if path.as_posix().endswith("/" + e.name)), key=lambda e: -len(e.name))
            found = named[:1] or found
            if len(found) > 1 and path.is_file():
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                same = next((e for e in found if (e.bytes, e.sha256) == (size, digest)), None)
                checks.add("external", same.name if same else path.name, same is not None,
                           f"{size} bytes, sha256 matches" if same else f"{size} bytes, sha256 {digest[:16]}...: a "
                           f"copy of none of {', '.join(e.name for e in found)}")
                continue
            pairs = [(found[0], path)]
        for record, file in pairs:
            if not file.is_file():
                checks.add("external", record.name, False, f"missing in {path}")
                continue
            size = file.stat().st_size
            if size != record.bytes:
                checks.add("external", record.name, False, f"{size} bytes, the release records {record.bytes}")
                continue
            with open(file, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            ok = digest == record.sha256
            checks.add("external", record.name, ok, f"{size} bytes, sha256 matches" if ok else
                       f"sha256 {digest[:16]}... differs from the recorded {record.sha256[:16]}...")
    return Report(folder=report.folder, checks=tuple(checks), manifest=manifest)


def check_folder_arg(path: Path) -> Path:
    try:
        is_dir = path.is_dir()
    except OSError as exc:  # under a folder this user cannot enter (Path.is_dir raises EACCES)
        raise InputError(f"{path}: cannot read it ({exc.strerror}); give a release folder this user can read") \
            from None
    if not is_dir:
        raise InputError(f"{path}: not a folder (give the release folder, e.g. release/1.3.1)")
    if not os.access(path, os.R_OK | os.X_OK):  # its files would each be "Permission denied", exit 1
        raise InputError(f"{path}: cannot read it (Permission denied); give a release folder this user can read")
    return path
