"""What an image holds, read in the pass that archives it: OS and Python packages, native libraries.

The archive stage reads each layer once on its way to the compressor; :class:`LayerInspector` gives
it a second sink per layer (a tee), a :class:`~unibake.imagetar.TarWalker` over the layer's bytes
that keeps only what the SBOM needs and never holds a layer in memory:

* ``var/lib/dpkg/status`` (and ``status.d/*``), Alpine's ``lib/apk/db/installed``, ``etc/os-release``:
  kept whole (small texts); RPM's SQLite database (``rpmdb.sqlite``, and its ``-wal``, of RHEL/UBI 9,
  Rocky, Fedora, Amazon Linux 2023) and its Berkeley DB ``Packages`` (RHEL/UBI 8, Amazon Linux 2) kept whole and
  read by :mod:`unibake.rpmdb`; RPM's NDB database (SUSE; not read) is said to be left out;
* a conda environment's ``conda-meta/NAME-VERSION-BUILD.json``: its name alone (the package it records);
* ``*.dist-info/METADATA``, ``*.egg-info/PKG-INFO``, ``*.egg/EGG-INFO/PKG-INFO`` and a ``*.egg-info``
  file (which is a PKG-INFO): their first 64 KiB (the headers); a zipped egg: its name;
* every shared library (``*.so``, ``*.so.N``) under the install root: its sha256 and size;
* the other files under the install root: their sha256, for a library that is a hard link to one;
* links and files where a folder of those could have been: they hide what lay under it below.

Layers the engine keeps in memory (below the spool threshold) are read from their bytes afterwards.
:meth:`LayerInspector.finish` then stacks the layers as the engine does (a later file replaces an
earlier one; ``.wh.`` whiteouts and opaque folders remove what lies below) and parses the texts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import posixpath
import shlex
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.parser import HeaderParser

from sortedcontainers import SortedDict

from .errors import ArchiveError
from . import rpmdb
from .files import visible_name
from .imagetar import BLOCK, SavedImage, TarEntry, TarWalker, looks_like_layer, pax_records

DPKG_STATUS = "var/lib/dpkg/status"
DPKG_STATUS_D = "var/lib/dpkg/status.d/"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
APK_INSTALLED = "lib/apk/db/installed"  # Alpine's package database: "P:name", "V:version" stanzas
RPM_FOLDERS = ("var/lib/rpm", "usr/lib/sysimage/rpm")
# RPM's SQLite database (rpm 4.16 on: RHEL/UBI 9, Fedora 33, Amazon Linux 2023) is read, with its write-ahead log
RPM_SQLITE = tuple(f"{folder}/rpmdb.sqlite" for folder in RPM_FOLDERS)
RPM_WAL = tuple(f"{path}-wal" for path in RPM_SQLITE)
# RPM's Berkeley DB database (rpm before 4.16: RHEL/UBI 8, Amazon Linux 2) is read too
RPM_BDB = tuple(f"{folder}/Packages" for folder in RPM_FOLDERS)
# RPM's NDB database (SUSE), which is not read: a base that has one is said to be left out
RPM_DATABASES = tuple(f"{folder}/Packages.db" for folder in RPM_FOLDERS)
# an egg folder (setup.py install: flash-attn, apex) holds its PKG-INFO in EGG-INFO/
PY_METADATA = (".dist-info/METADATA", ".egg-info/PKG-INFO", ".egg/EGG-INFO/PKG-INFO")
EGG_INFO = ".egg-info"  # a file of that name (distutils' install_egg_info) is the PKG-INFO itself
EGG = ".egg"  # a zipped egg in site-packages: NAME-VERSION-pyX.Y[-PLATFORM].egg, known by its name alone
TEXT_LIMIT = 64 << 20  # a dpkg status of a large distribution is a few MB
# the packages a status file (dpkg's, status.d's, apk's) adds, up to this many in all: a 64 MiB status of 3-line
# stanzas listed 2.9 million (a minute, 1 GB), where the SBOM lists 20 000 (sbom.MAX_PACKAGES)
PACKAGES_READ = 200_000
HEADER_LIMIT = 64 << 10  # a METADATA file's headers come first; its long description is not needed
UNTRACKED_LIMIT = 100_000  # digests kept of other files under the install root, for the hard links to them
# the texts kept of all layers together until they are stacked: each file is bounded, their number is not (a
# base of a hundred 60 MiB status.d files, zeros, is a few MB to pull and was 6 GB held here)
KEPT_LIMIT = 512 << 20
WHITEOUT = ".wh."
# folders a package list or os-release lies in: a layer that makes one a link or a file hides what it held
PACKAGE_FOLDERS = ("var", "var/lib", "var/lib/dpkg", DPKG_STATUS_D.rstrip("/"), "etc", "usr", "usr/lib", "lib",
                   "lib/apk", "lib/apk/db", "var/lib/rpm", "usr/lib/sysimage", "usr/lib/sysimage/rpm")
PY_FOLDERS = (".dist-info", ".egg-info", ".egg", "EGG-INFO", "site-packages", "dist-packages")
OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True, kw_only=True)
class Package:
    """An OS (``deb``) or Python (``pypi``) package found in the image."""

    kind: str  # deb | apk | rpm | conda | pypi
    name: str
    version: str
    arch: str = ""
    source: str = ""  # deb, apk: the source package, when it differs; rpm: its source RPM; conda: the build string
    path: str = ""  # where it was found: /var/lib/dpkg/status or the .dist-info folder
    layer: str = ""  # the diffID of the layer that gave it


@dataclass(frozen=True, kw_only=True)
class Library:
    """A shared library under the install root: its digest as it lies in the image."""

    path: str  # absolute, e.g. /opt/unibake/kernels/rmsnorm/librmsnorm.so
    sha256: str
    size: int
    layer: str


@dataclass(frozen=True, kw_only=True)
class OsRelease:
    id: str
    version_id: str
    pretty_name: str


@dataclass(frozen=True, kw_only=True)
class ImageContents:
    """What the image's layers hold, stacked: the SBOM's raw material."""

    packages: tuple[Package, ...]
    libraries: tuple[Library, ...]
    os: OsRelease | None
    layers: int
    not_inspected: tuple[str, ...]  # diffIDs of layers that could not be read (compressed)
    problems: tuple[str, ...] = ()

    def library(self, path: str) -> Library | None:
        return next((lib for lib in self.libraries if lib.path == path), None)


PROBLEM_LIMIT = 1000  # what the pass could not list, said one by one up to this many; the rest counted


class _Said(list):
    """What could not be listed, the first ``PROBLEM_LIMIT`` kept and the rest counted: a base of a million
    links named like Python packages made as many lines, in memory and in the SBOM."""

    def __init__(self):
        super().__init__()
        self.more = 0

    def append(self, problem: str) -> None:
        if len(self) < PROBLEM_LIMIT:
            super().append(problem)
        else:
            self.more += 1


@dataclass
class _Found:
    """What one layer holds of interest: files by path, and what it removes from the layers below."""

    files: SortedDict = field(default_factory=SortedDict)  # path -> (kind, bytes or (sha, size))
    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # tracked names this layer makes something else
    replaced: list[str] = field(default_factory=list)  # folders that could hold tracked files, made not a folder
    problems: _Said = field(default_factory=_Said)


def found_to_json(found: _Found) -> dict:
    """What a layer holds of interest as JSON (texts in base64), for :func:`found_from_json`."""
    files = []
    for path, (kind, value) in found.files.items():
        if isinstance(value, bytes):
            files.append([path, kind, base64.b64encode(value).decode("ascii")])
        else:
            files.append([path, kind, list(value)])
    return {"files": files, "whiteouts": list(found.whiteouts), "opaque": list(found.opaque),
            "hidden": list(found.hidden), "replaced": list(found.replaced), "problems": list(found.problems),
            "more_problems": found.problems.more}


def found_from_json(data: object) -> _Found:
    """:func:`found_to_json`'s output read back; ValueError when it is not that."""
    try:
        found = _Found()
        for path, kind, value in data["files"]:
            if not isinstance(path, str) or not isinstance(kind, str):
                raise ValueError("a file of the record is not (path, kind, value)")
            if isinstance(value, str):
                found.files[path] = (kind, base64.b64decode(value.encode("ascii"), validate=True))
            elif isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and type(value[1]) is int:
                found.files[path] = (kind, (value[0], value[1]))
            else:
                raise ValueError("a file's value is neither a text nor a digest and a size")
        for key in ("whiteouts", "opaque", "hidden", "replaced"):
            values = data[key]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"{key} is not a list of paths")
            getattr(found, key).extend(values)
        if not isinstance(data["problems"], list) or type(data["more_problems"]) is not int:
            raise ValueError("problems is not a list")
        for problem in data["problems"]:
            found.problems.append(str(problem))
        found.problems.more += data["more_problems"]
        return found
    except (KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"not a layer's record: {exc}") from None


def _engine_name(entry: TarEntry) -> str:
    """The member's name as the engine reads it (Go's archive/tar, which unpacked the layer) where
    Python's tarfile reads another: the ustar prefix field, which Go joins under POSIX magic only (131
    bytes of it with a star trailer, "tar" at byte 508) and under GNU magic only when the field does not
    read as the access and change times kept there. A base's author could otherwise hide a package list
    from the SBOM behind a prefix "0" the engine ignores."""
    block = entry.header
    if len(block) < BLOCK or not block[345:500].strip(b"\0") or entry.type in tarfile.GNU_TYPES or any(
            _names(extended, data) for extended, data in entry.extended):
        return entry.name  # no prefix, or a name from an extended header, which both read alike

    def text(field: bytes) -> str:
        return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def octal(field: bytes) -> bool:  # as Go parses a GNU time field (one beginning with a NUL is not read)
        value = field.strip(b" \0").split(b"\0", 1)[0]
        return not field[0] or bool(field[0] & 0x80) or set(value) <= set(b"01234567")

    name, magic = text(block[0:100]), block[257:263]
    if magic == b"ustar\0":  # Go reads the version field only to tell GNU's
        prefix = text(block[345:476] if block[508:512] == b"tar\0" else block[345:500])
    elif block[257:265] == tarfile.GNU_MAGIC and not (octal(block[345:357]) and octal(block[357:369])) and \
            block[345:500].split(b"\0", 1)[0].isascii():
        prefix = text(block[345:500])
    else:
        prefix = ""
    return f"{prefix}/{name}" if prefix else name


def _names(header: bytes, data: bytes) -> bool:
    """Whether an extended header gives the member its name (a GNU long name, a pax path), as the walker
    takes one: a pax header of other records (a comment, times) leaves the name to the member's own header."""
    if header[156:157] == tarfile.GNUTYPE_LONGNAME:
        return bool(data.split(b"\0", 1)[0])
    if header[156:157] == tarfile.XHDTYPE:
        return bool(pax_records(data[:tarfile.nti(header[124:136])], "a layer").get("path"))
    return False


def _path(name: str) -> str:
    """A member's path as the SBOM names it: a byte that is not UTF-8 (held by the tar reader as a lone
    surrogate, which no JSON reader takes) written visibly as ``\\xff``."""
    return visible_name(posixpath.normpath("/" + name).lstrip("/"))


class _LayerReader:
    """A sink for one layer's bytes (a tee beside the compressor), and the walker's visitor."""

    def __init__(self, libraries_under: str, on_close, kept: list[int] | None = None):
        self._under = libraries_under
        self._on_close = on_close
        self._kept = kept if kept is not None else [0]  # bytes of texts kept, shared by the inspector's layers
        self.found = _Found()
        self._walker = TarWalker(self, "a layer")
        self._current: tuple[str, str, object] | None = None  # (path, kind, bytearray or hash)
        # other files under the install root: a library may be a hard link to one, and a tar names a hard
        # link's content only by the member before it that holds it
        self._untracked: dict[str, tuple[str, int]] = {}
        self._size = 0
        self.failed: str | None = None

    def kind_of(self, path: str) -> str | None:
        base = posixpath.basename(path)
        if path == DPKG_STATUS or path.startswith(DPKG_STATUS_D) or path in OS_RELEASE or path == APK_INSTALLED:
            return "text"
        if path in RPM_SQLITE or path in RPM_WAL or path in RPM_BDB:
            return "rpmdb"  # kept whole, as a text is
        if path in RPM_DATABASES:
            return "rpm"
        if base.endswith(EGG) and posixpath.basename(posixpath.dirname(path)) in ("site-packages", "dist-packages"):
            return "egg"
        if base.endswith(".json") and posixpath.basename(posixpath.dirname(path)) == "conda-meta":
            return "conda"
        if path.endswith(PY_METADATA):
            return "metadata"
        if path.startswith(self._under) and (base.endswith(".so") or ".so." in base):
            return "library"
        return None

    def _could_hold_tracked(self, path: str, entry: TarEntry) -> bool:
        """Whether a path that is not a folder here may have been a folder of tracked files in a layer below:
        every link, and any entry where package lists, Python distributions or the install root's libraries
        lie; not every file of the layer, so what is kept stays small."""
        if entry.type == tarfile.SYMTYPE or path in PACKAGE_FOLDERS or path.endswith(PY_FOLDERS):
            return True
        return bool(self._under) and (path.startswith(self._under) or self._under.startswith(path + "/"))

    # the sink: a layer it cannot parse is reported as not inspected; the archive is not the inspector's to fail
    def write(self, piece: memoryview) -> None:
        if self.failed is None:
            try:
                self._walker.feed(piece)
            except ArchiveError as exc:
                self.failed = str(exc)

    def close(self) -> None:
        if self.failed is None:
            try:
                self._walker.close()
            except ArchiveError as exc:
                self.failed = str(exc)
        self._on_close(self.found if self.failed is None else None)

    # the visitor
    def begin(self, entry: TarEntry) -> None:
        path = _path(_engine_name(entry))
        folder, base = posixpath.split(path)
        if base == OPAQUE:
            self.found.opaque.append(folder)
            return
        if base.startswith(WHITEOUT):
            self.found.whiteouts.append(posixpath.join(folder, base[len(WHITEOUT):]))
            return
        # a name given twice in a layer: the engine unpacks the later entry in place of the earlier one (and
        # of what an earlier folder of that name held), unless both are folders
        self.found.files.pop(path, None)
        self._untracked.pop(path, None)
        if entry.type != tarfile.DIRTYPE and path:
            _drop_under(self.found.files, path)
        if entry.type != tarfile.DIRTYPE and self._could_hold_tracked(path, entry):
            self.found.replaced.append(path)  # overlayfs shows the new entry, nothing that lay under it
            if entry.type in (tarfile.SYMTYPE, tarfile.LNKTYPE) and path in PACKAGE_FOLDERS[:4]:
                self.found.problems.append(f"/{path} is a link to {visible_name(entry.linkname)}, not a folder: the packages "
                                           "listed under it are not in the SBOM")
        kind = self.kind_of(path)
        if entry.type == tarfile.SYMTYPE and (base.endswith((".dist-info", EGG_INFO)) or kind == "egg"):
            # Python reads a distribution through the link (importlib.metadata follows it); this pass
            # reads names, not links: said, as a package list behind a link is
            self.found.problems.append(f"/{path} is a link to {visible_name(entry.linkname)}: the Python package "
                                       "behind it is not in the SBOM")
        if kind is None and path.endswith(EGG_INFO):
            if entry.type in (*tarfile.REGULAR_TYPES, tarfile.LNKTYPE):
                kind = "metadata"  # a single-file .egg-info
            elif entry.type == tarfile.DIRTYPE:
                self.found.hidden.append(path)  # a folder now: a single file of that name below is gone
        if kind == "egg" and entry.type in (tarfile.DIRTYPE, tarfile.SYMTYPE):
            self.found.hidden.append(path)  # an egg folder (its EGG-INFO/PKG-INFO is read), or a link: not a zipped egg
            kind = None
        if kind is None:
            if (entry.type in tarfile.REGULAR_TYPES and self._under and path.startswith(self._under)
                    and len(self._untracked) < UNTRACKED_LIMIT):
                self._current = (path, "untracked", hashlib.sha256())
                self._size = 0
            return
        if entry.type == tarfile.LNKTYPE:  # a hard link: the same content as a file earlier in this layer
            target = _path(entry.linkname)
            same = self.found.files.get(target)
            if kind == "library" and same is None and target in self._untracked:
                same = (kind, self._untracked[target])
            if same is not None and same[0] == kind:
                self.found.files[path] = same
            elif kind == "library":  # listed all the same: a library left out would go unnoticed
                self.found.files[path] = (kind, ("", 0))
                self.found.problems.append(f"/{path} is a hard link to /{target}, which was not read: it is listed "
                                           "without its sha256")
            else:
                self._unread(path, kind, f"a hard link to /{target}")
            return
        if entry.type not in tarfile.REGULAR_TYPES:
            self._unread(path, kind, "a link or a folder")  # where a tracked file was, or would be
            return
        if kind in ("rpm", "conda", "egg"):  # not read: its presence (and a package's name) is what is said
            self.found.files[path] = (kind, b"")
            return
        self._current = (path, kind, hashlib.sha256() if kind == "library" else bytearray())
        self._size = 0

    def data(self, piece: memoryview) -> None:
        if self._current is None:
            return
        path, kind, sink = self._current
        self._size += len(piece)
        if kind in ("library", "untracked"):
            sink.update(piece)
        elif len(sink) < (HEADER_LIMIT if kind == "metadata" else TEXT_LIMIT + 1):
            sink += piece

    def _unread(self, path: str, kind: str, what: str) -> None:
        """A package list or package metadata that is not a plain file here is not read: said, so a
        base image cannot leave its packages out of the SBOM unnoticed (the shared libraries' links
        and os-release's usual link are not worth a word)."""
        self.found.hidden.append(path)
        if kind != "library" and path not in OS_RELEASE:
            self.found.problems.append(f"/{path} is {what}, not a file: the packages it lists are not in the SBOM")

    def end(self) -> None:
        if self._current is None:
            return
        path, kind, sink = self._current
        self._current = None
        if kind == "untracked":
            self._untracked[path] = (sink.hexdigest(), self._size)
        elif kind == "library":
            self.found.files[path] = (kind, (sink.hexdigest(), self._size))
        elif kind in ("text", "rpmdb") and len(sink) > TEXT_LIMIT:
            self.found.problems.append(f"/{path} is larger than {TEXT_LIMIT} bytes: not read")
            self.found.hidden.append(path)
        elif self._kept[0] + min(len(sink), HEADER_LIMIT if kind == "metadata" else len(sink)) > KEPT_LIMIT:
            self.found.problems.append(f"/{path} is not read: the package lists and metadata read before it "
                                       f"already hold {KEPT_LIMIT >> 20} MiB")
            self.found.hidden.append(path)
        else:
            value = bytes(sink[:HEADER_LIMIT] if kind == "metadata" else sink)
            self._kept[0] += len(value)
            self.found.files[path] = (kind, value)

    def raw(self, piece: memoryview) -> None:
        pass


class LayerInspector:
    """Reads the layers of one save stream for :class:`ImageContents`; one per archive pass."""

    def __init__(self, install_root: str):
        root = install_root.strip("/")
        self._under = root + "/" if root else ""  # "/": every library of the image
        self._found: dict[str, _Found] = {}  # by member name
        self._kept = [0]  # bytes of texts the layers' readers keep, together (KEPT_LIMIT)

    def sink(self, name: str, size: int, head: bytes) -> _LayerReader | None:
        """A sink for a routed member's bytes when it is a layer; None otherwise."""
        if not looks_like_layer(name, head):
            return None
        return _LayerReader(self._under, lambda found: self._found.__setitem__(name, found), self._kept)

    def _read_small(self, name: str, data: bytes) -> _Found | None:
        if not looks_like_layer(name, data[:BLOCK]):
            return None
        reader = _LayerReader(self._under, lambda found: None, self._kept)
        reader.write(memoryview(data))
        reader.close()
        return None if reader.failed else reader.found

    def preload(self, name: str, found: _Found) -> None:
        """What an earlier pass found in the layer that is member ``name`` of this stream (its bytes not
        in the stream: a hotfix's bottom layers, :mod:`unibake.assemble`); its kept texts count as read."""
        self._found[name] = found
        self._kept[0] += sum(len(value) for kind, value in found.files.values() if isinstance(value, bytes))

    def found(self, name: str) -> _Found | None:
        """What the layer that is member ``name`` holds of interest, once :meth:`finish` has run; None when
        it could not be read."""
        return self._found.get(name)

    def finish(self, saved: SavedImage) -> ImageContents:
        """The layers stacked in the image's order, and the texts parsed."""
        layers: list[tuple[str, _Found]] = []
        missing = []
        for member, diff_id in zip(saved.layer_members, saved.diff_ids):
            found = None
            if member is not None:
                found = self._found.get(member.name)
                if found is None and member.name not in self._found and member.data is not None:
                    found = self._found[member.name] = self._read_small(member.name, member.data)
            if found is None:
                missing.append(diff_id)
            else:
                layers.append((diff_id, found))
        return _stack(layers, len(saved.diff_ids), tuple(missing))


def _drop_under(files: SortedDict, folder: str) -> None:
    """Every path under ``folder`` ("" the root: every path) taken out of ``files``: the paths sorted, those
    under one folder lie together, found at once (a whiteout compared with every path kept took hours for
    tens of thousands of each)."""
    if not folder:
        files.clear()
        return
    prefix = folder.rstrip("/") + "/"
    for path in list(itertools.takewhile(lambda p: p.startswith(prefix), files.irange(minimum=prefix))):
        del files[path]


def _stack(layers: list[tuple[str, _Found]], count: int, missing: tuple[str, ...]) -> ImageContents:
    files: SortedDict = SortedDict()  # path -> (diffID, kind, value)
    problems = _Said()
    for diff_id, found in layers:
        for gone in found.whiteouts:
            if gone:  # ".wh." alone names nothing
                files.pop(gone, None)
                _drop_under(files, gone)
        for folder in found.opaque:  # what lay in the folder below, the root's ("") included, as the OCI spec says
            _drop_under(files, folder)
        for path in found.hidden:
            files.pop(path, None)
        for folder in found.replaced:  # a link or a file where a folder was: what lay under it is gone
            if folder:
                _drop_under(files, folder)
        for path, (kind, value) in found.files.items():
            files[path] = (diff_id, kind, value)
        for problem in found.problems:
            problems.append(problem)
        problems.more += found.problems.more
    packages: list[Package] = []
    libraries: list[Library] = []
    os_release = None
    for path, (diff_id, kind, value) in files.items():  # sorted by path
        if kind == "library":
            sha, size = value
            libraries.append(Library(path="/" + path, sha256=sha, size=size, layer=diff_id))
        elif kind == "metadata":
            package = _python_package(value, path, diff_id)
            if package is None:
                problems.append(f"/{path} names no package and version: left out")
            elif _nameable(package, problems):
                packages.append(package)
        elif path in OS_RELEASE:
            if os_release is None or path == OS_RELEASE[0]:
                os_release = _os_release(value)
        elif kind == "rpm":
            problems.append(f"/{path} is an RPM database, which unibake does not read: the packages it lists are not "
                            "in the SBOM")
        elif kind == "rpmdb":
            if path in RPM_SQLITE or path in RPM_BDB:
                wal = files.get(path + "-wal")
                found, problem = rpmdb.bdb_packages(value) if path in RPM_BDB else \
                    rpmdb.packages(value, wal[2] if wal is not None and wal[1] == "rpmdb" else b"")
                if problem and found:
                    problems.append(f"/{path} was read in part: {problem}; the {len(found)} packages read are in the "
                                    "SBOM, the others it lists are not")
                elif problem:
                    problems.append(f"/{path} could not be read: {problem}; the packages it lists are not in the SBOM")
                packages += [p for p in (Package(kind="rpm", name=r.name, version=r.version, arch=r.arch,
                                                 source=r.source_rpm, path="/" + path, layer=diff_id) for r in found)
                             if _nameable(p, problems)]
        elif kind == "conda":
            package = _conda_package(path, diff_id)
            if package is None:
                problems.append(f"/{path} is not named NAME-VERSION-BUILD.json, as conda names its records: left out")
            elif _nameable(package, problems):
                packages.append(package)
        elif kind == "egg":
            name, _, rest = posixpath.basename(path).partition("-")
            version = rest.partition("-")[0].removesuffix(EGG)
            if name and version:
                package = Package(kind="pypi", name=name, version=version, path="/" + path, layer=diff_id)
                if _nameable(package, problems):
                    packages.append(package)
            else:
                problems.append(f"/{path} is not named NAME-VERSION-pyX.Y.egg, as setuptools names an egg: left out")
        else:  # (a dpkg status file, status.d's, or apk's database: read up to what the image may list in all)
            read = _apk_packages if path == APK_INSTALLED else _dpkg_packages
            room = max(0, PACKAGES_READ - len(packages))
            found = list(itertools.islice(read(value, path, diff_id), room + 1))
            if len(found) > room:
                problems.append(f"/{path} lists more packages than the {PACKAGES_READ} an image's are read up to "
                                f"(a distribution installs a few thousand): the first {room} it lists are in the "
                                "SBOM, the others are not")
            packages += [p for p in found[:room] if _nameable(p, problems)]
    packages.sort(key=lambda p: (p.kind, p.name.lower(), p.version, p.path))
    return ImageContents(packages=tuple(packages), libraries=tuple(libraries), os=os_release, layers=count,
                         not_inspected=missing, problems=tuple(problems) + (
                             (f"and {problems.more} more like those above: not said one by one",) if problems.more
                             else ()))


def _nameable(package: Package, problems: list[str]) -> bool:
    """Whether a package's name can stand in a package URL: a '/' would make it name another package
    (``a/b`` reads back as ``b``; packageurl-python does not encode it), and no dpkg or Python package
    name holds one. Said when not, so the SBOM and the build log's count leave it out alike."""
    if not package.name.strip():  # (a conda-meta file " -1.0-b.json": the purl's name became None, a traceback)
        problems.append(f"{package.path} lists a package without a name; left out")
        return False
    if "/" not in package.name:
        return True
    problems.append(f"{package.path} lists a package named {package.name[:80]!r}: a name with '/' would name "
                    "another package in the SBOM; left out")
    return False


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _stanzas(text: str) -> Iterator[str]:
    """The stanzas of ``text`` (separated by an empty line), one at a time: a 64 MiB file is not split whole."""
    at = 0
    while at < len(text):
        end = text.find("\n\n", at)
        end = len(text) if end < 0 else end
        yield text[at:end]
        at = end + 2


def _dpkg_packages(data: bytes, path: str, diff_id: str) -> Iterator[Package]:
    """The installed packages of a dpkg status file: RFC 822 stanzas, read by the standard library's
    header parser (continuation lines included), one stanza at a time, as they are asked for."""
    parser = HeaderParser()
    for stanza in _stanzas(_text(data)):
        if not stanza.strip():
            continue
        fields = parser.parsestr(stanza.strip("\n") + "\n")
        name, version = (fields.get("Package") or "").strip(), (fields.get("Version") or "").strip()
        status = (fields.get("Status") or "install ok installed").split()
        # its files are in the image unless dpkg says they are gone: "unpacked" (dpkg --unpack, no postinst
        # run), "half-configured" or "triggers-pending" still ship the package; "config-files" and
        # "not-installed" do not
        if not name or not version or status[-1:] in (["config-files"], ["not-installed"]):
            continue
        source = (fields.get("Source") or "").split(" ")[0].strip()
        yield Package(kind="deb", name=name, version=version, arch=(fields.get("Architecture") or "").strip(),
                      source=source if source != name else "", path="/" + path, layer=diff_id)


def _apk_packages(data: bytes, path: str, diff_id: str) -> Iterator[Package]:
    """The installed packages of Alpine's ``lib/apk/db/installed``: stanzas of ``X:value`` lines, one
    a package (``P`` its name, ``V`` its version, ``A`` its architecture, ``o`` its origin)."""
    for stanza in _stanzas(_text(data)):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and len(key) == 1:
                fields.setdefault(key, value.strip())
        name, version = fields.get("P", ""), fields.get("V", "")
        if name and version:
            origin = fields.get("o", "")
            yield Package(kind="apk", name=name, version=version, arch=fields.get("A", ""),
                          source=origin if origin != name else "", path="/" + path, layer=diff_id)


def _conda_package(path: str, diff_id: str) -> Package | None:
    """A conda package by its record's name in ``conda-meta``: ``NAME-VERSION-BUILD.json`` (neither the
    version nor the build holds a '-'); the record itself (its file list, megabytes) is not read."""
    parts = posixpath.basename(path).removesuffix(".json").rsplit("-", 2)
    if len(parts) != 3 or not all(parts):
        return None
    name, version, build = parts
    return Package(kind="conda", name=name, version=version, source=build, path="/" + path, layer=diff_id)


def _python_package(data: bytes, path: str, diff_id: str) -> Package | None:
    """``Name`` and ``Version`` of a core-metadata file (the email header format the spec names)."""
    headers = _text(data).split("\n\n", 1)[0] + "\n"
    fields = HeaderParser().parsestr(headers)
    name, version = (fields.get("Name") or "").strip(), (fields.get("Version") or "").strip()
    if not name or not version:
        return None
    # the .egg-info file, the .egg folder whose EGG-INFO it is, or the .dist-info or .egg-info folder
    where = path if path.endswith(EGG_INFO) else posixpath.dirname(posixpath.dirname(path)) if \
        path.endswith(PY_METADATA[2]) else posixpath.dirname(path)
    return Package(kind="pypi", name=name, version=version, path="/" + where, layer=diff_id)


OS_RELEASE_READ = 64 << 10  # a real os-release is under 1 kB, each line under 200 bytes
OS_RELEASE_LINE = 4096


def _os_release(data: bytes) -> OsRelease:
    values = {}
    # only the three keys read, each line bounded: shlex.split takes time that grows with the square of a line's
    # length (a 1 MiB PRETTY_NAME cost 15 s of the archive stage, 4 MiB two minutes)
    for line in _text(data[:OS_RELEASE_READ]).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "VERSION_ID", "PRETTY_NAME") and len(value) <= OS_RELEASE_LINE:
            try:
                values[key.strip()] = " ".join(shlex.split(value))  # the shell quoting os-release uses
            except ValueError:
                values[key.strip()] = value.strip()
    return OsRelease(id=values.get("ID", ""), version_id=values.get("VERSION_ID", ""),
                     pretty_name=values.get("PRETTY_NAME", ""))
