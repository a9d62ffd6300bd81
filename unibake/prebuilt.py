"""Prebuilt kernels, taken as they are: a ``.so``, a tarball or a wheel.

The file is an input like any other (hashed, pinned in ``inputs.lock``). A tarball or a wheel is
unpacked, unchanged, into the kernel's folder in the image; this module lists its members (with the
sha256 of each, so the image's ledger knows them before the build) and hands each member's bytes to
the build context. Nothing is ever extracted to disk. Members that would leave the kernel's folder
(absolute names, ``..``, links pointing out), devices and FIFOs are refused; a link inside the
archive is baked as a copy of what it points to.
"""

from __future__ import annotations

import hashlib
import lzma
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from .errors import InputError
from .files import open_regular, visible_name
from .inputs import InputFile, file_and_folder
from .schema import describe_character, hidden_character

# what a damaged deflate or xz stream raises as it is read (neither is an OSError, as a damaged gzip one is)
DAMAGED = (zlib.error, lzma.LZMAError)

SO_RE = re.compile(r"\.so(?:\.[0-9]+)*$")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
ZIP_SUFFIXES = (".whl", ".zip")
MAX_MEMBERS = 20_000
MAX_BYTES = 64 << 30


@dataclass(frozen=True, kw_only=True)
class Member:
    """One file of a prebuilt kernel: where it goes in the kernel's folder, and what it holds."""

    path: str
    source: str  # its name in the archive (the file it is a copy of, for a link)
    sha256: str
    size: int
    mode: int


@dataclass(frozen=True, kw_only=True)
class Prebuilt:
    """A prebuilt file and what it unpacks to."""

    file: InputFile
    kind: str  # so | tar | zip
    members: tuple[Member, ...]

    @property
    def libraries(self) -> tuple[str, ...]:
        """Every shared library it holds, by its path in the kernel's folder."""
        return tuple(m.path for m in self.members if SO_RE.search(m.path))


def kind_of(name: str) -> str | None:
    """``so``, ``tar`` or ``zip`` from a file name; None when it is none of them."""
    lower = name.lower()
    if SO_RE.search(lower):
        return "so"
    if lower.endswith(TAR_SUFFIXES):
        return "tar"
    if lower.endswith(ZIP_SUFFIXES):
        return "zip"
    return None


def _clean(name: str, where: str) -> str:
    """A member name as a relative path inside the kernel's folder; refused when it would leave it."""
    path = name.removeprefix("./").rstrip("/")
    parts = path.split("/")
    if not path or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InputError(f"{where}: the archive member {name[:120]!r} would leave the kernel's folder")
    if any(ord(c) < 0x20 or c in "\\\x7f" for c in path):  # (inside the folder, and no name to bake)
        raise InputError(f"{where}: the archive member {name[:120]!r} holds a control character or a backslash, which "
                         "no file name the image bakes may hold; rename it in the archive")
    shown = visible_name(path)
    if shown != path:  # (a tar's name that is not UTF-8: no ledger can name it, and the render's write failed)
        raise InputError(f"{where}: the archive member '{shown[:120]}' is not a UTF-8 name; rename it in the archive")
    bad = hidden_character(path)
    if bad is not None:  # (held to the rule of every other file the image bakes: inputs._check_hidden_name)
        raise InputError(f"{where}: the archive member {path[:120]!r} holds {describe_character(bad)}, a control or "
                         "invisible format character that shows the name otherwise in the lock and the ledgers; "
                         "rename it in the archive")
    return path


def _digest(stream: BinaryIO) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    for block in iter(lambda: stream.read(1 << 20), b""):
        h.update(block)
        size += len(block)
    return h.hexdigest(), size


# ELF e_machine values, as uname -m names them (Platform.machine)
ELF_MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64", 183: "aarch64",
                243: "riscv64", 258: "loongarch64"}


def _check_elf(file: InputFile, where: str, machine: str) -> None:
    """A prebuilt .so must be an ELF file for ``machine``: else the image only fails once built, with the
    loader's 'cannot open shared object file'."""
    with open(file.absolute, "rb") as fh:
        _check_head(fh.read(20), file.path, where, machine)


def _check_head(head: bytes, shown: str, where: str, machine: str) -> None:
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        raise InputError(f"{where}: prebuilt {shown} is not an ELF shared library (it does not start as one); "
                         "give the library itself")
    found = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    name = ELF_MACHINES.get(found, f"ELF machine {found}")
    if name != machine:
        raise InputError(f"{where}: prebuilt {shown} is built for {name}, not for {machine}, the platform's "
                         "architecture; give that platform's build (a kernel's platforms: names one per platform)")


def check_libraries(prebuilt: Prebuilt, outputs: tuple[str, ...], where: str, machine: str) -> None:
    """Each library of a wheel or tarball that the image loads (``outputs``) must be an ELF library for
    ``machine``, as a prebuilt .so must: one wheel for every platform put an x86_64 library in the arm64
    image, whose self-check failed once built (under emulation)."""
    if prebuilt.kind == "so":
        return  # (checked as it was read)
    members = {m.path: m for m in prebuilt.members}
    for out in outputs:
        with open_member(prebuilt, members[out]) as fh:
            head = fh.read(20)
        _check_head(head, f"{prebuilt.file.path}'s {out}", where, machine)


def read_prebuilt(file: InputFile, where: str, machine: str | None = None) -> Prebuilt:
    """List and hash what ``file`` unpacks to; InputError naming ``where`` for anything unsafe. A
    ``.so`` must be an ELF library for ``machine`` (``uname -m``'s name) when one is given."""
    kind = kind_of(file.path)
    if kind is None:
        raise InputError(f"{where}: prebuilt {file.path!r} is not a .so, a tarball ({', '.join(TAR_SUFFIXES)}) "
                         f"or a wheel (.whl, .zip)")
    if kind == "so":
        if machine is not None:
            _check_elf(file, where, machine)
        name = posixpath.basename(file.path)
        return Prebuilt(file=file, kind=kind, members=(Member(path=name, source=name, sha256=file.sha256,
                                                               size=file.size, mode=file.mode),))
    try:
        # listed from the bytes the plan hashed (inputs.lock's sha256, which the release records for it): one
        # replaced since, or that the file digests' memo took for unchanged, would give the image another
        # archive's files under this one's name; hashed again (a raw read, cheaper than the listing's decoding)
        with open_regular(file.absolute) as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != file.sha256:
                raise InputError(f"input '{file.path}' changed since it was hashed (its sha256 is no longer the one "
                                 "the plan took for it); run again")
            fh.seek(0)
            members = _tar_members(fh, file, where) if kind == "tar" else _zip_members(fh, file, where)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, *DAMAGED) as exc:
        raise InputError(f"{where}: prebuilt {file.path} is not a readable {kind} archive: {exc}") from None
    if not members:
        raise InputError(f"{where}: prebuilt {file.path} holds no files")
    clash = file_and_folder(m.path for m in members)
    if clash:  # unpacked, one would replace the other (or the build fail): refused, as a name given twice is
        raise InputError(f"{where}: prebuilt {file.path} holds both the file {clash[0]!r} and {clash[1]!r} inside "
                         "it, as if it were a folder")
    return Prebuilt(file=file, kind=kind, members=tuple(sorted(members, key=lambda m: m.path)))


def _check_counts(count: int, total: int, file: InputFile, where: str) -> None:
    if count > MAX_MEMBERS or total > MAX_BYTES:
        raise InputError(f"{where}: prebuilt {file.path} unpacks to more than {MAX_MEMBERS} files or "
                         f"{MAX_BYTES >> 30} GiB")


def _tar_members(fh: BinaryIO, file: InputFile, where: str) -> list[Member]:
    out: dict[str, Member] = {}
    with tarfile.open(fileobj=fh, mode="r:*") as tar:
        infos = tar.getmembers()
        by_name = {_clean(i.name, where): i for i in infos if not i.isdir()}
        total = 0
        for path, info in by_name.items():
            target = info
            for _ in range(32):  # follow links inside the archive, as a copy of what they name
                if target.issym():
                    link = posixpath.normpath(posixpath.join(posixpath.dirname(_clean(target.name, where)),
                                                             target.linkname))
                elif target.islnk():
                    link = target.linkname.removeprefix("./")
                else:
                    break
                if link.startswith(("../", "/")) or link == ".." or link not in by_name:
                    raise InputError(f"{where}: the archive member {info.name[:120]!r} links to "
                                     f"{target.linkname[:120]!r}, outside the archive's files")
                target = by_name[link]
            if not target.isfile():
                raise InputError(f"{where}: the archive member {info.name[:120]!r} is not a regular file")
            digest, size = _digest(tar.extractfile(target))
            total += size
            _check_counts(len(out) + 1, total, file, where)
            out[path] = Member(path=path, source=target.name, sha256=digest, size=size,
                               mode=0o755 if target.mode & 0o111 else 0o644)
    return list(out.values())


def _zip_members(fh: BinaryIO, file: InputFile, where: str) -> list[Member]:
    out: dict[str, Member] = {}
    total = 0
    with zipfile.ZipFile(fh) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            path = _clean(info.filename, where)
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # many zips carry permission bits only
                raise InputError(f"{where}: the archive member {info.filename[:120]!r} is not a regular file")
            if path in out:
                raise InputError(f"{where}: the archive member {path!r} appears twice")
            total += info.file_size
            _check_counts(len(out) + 1, total, file, where)
            with zf.open(info) as fh:
                digest, size = _digest(fh)
            out[path] = Member(path=path, source=info.filename, sha256=digest, size=size,
                               mode=0o755 if mode & 0o111 else 0o644)
    return list(out.values())


@contextmanager
def open_member(prebuilt: Prebuilt, member: Member) -> Iterator[BinaryIO]:
    """The bytes of one member, as a readable stream. The file was hashed and listed at the plan: one
    replaced since (by a FIFO, or an archive without the member) is InputError naming it."""
    with open_regular(prebuilt.file.absolute) as raw:
        if prebuilt.kind == "so":
            yield raw
            return
        try:
            if prebuilt.kind == "tar":
                archive = tarfile.open(fileobj=raw, mode="r:*")
                stream = archive.extractfile(member.source)
                assert stream is not None
            else:
                archive = zipfile.ZipFile(raw)
                stream = archive.open(member.source)
        except (KeyError, tarfile.TarError, zipfile.BadZipFile):
            raise InputError(f"{prebuilt.file.absolute}: no longer holds {member.source!r} as it did when it was "
                             "hashed (the archive was replaced); run again") from None
        with archive, stream:
            try:
                yield stream
            except (tarfile.TarError, zipfile.BadZipFile, EOFError, *DAMAGED) as exc:  # (read by the caller)
                raise InputError(f"{prebuilt.file.absolute}: {member.source!r} no longer reads as it did when it "
                                 f"was hashed (the archive was replaced: {exc}); run again") from None
