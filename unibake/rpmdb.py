"""RPM's SQLite package database (``rpmdb.sqlite``), read for the SBOM.

rpm 4.16 and later (RHEL and UBI 9, Rocky and Alma 9, Fedora 33 on, Amazon Linux 2023) keep the installed
packages in an SQLite file: a table ``Packages(hnum INTEGER PRIMARY KEY, blob BLOB)``, each blob one
package's header as rpm's ``headerExport`` writes it, without its leading magic: the number of index
entries and the size of the data (big-endian 32-bit), the entries (tag, type, offset, count: 16 bytes
each), then the data, where a string is NUL-terminated and a 32-bit integer big-endian.

Read by hand, the few tags an SBOM needs, every offset bounds-checked: no maintained Python library reads
an rpm database (python3-rpm is rpm's own binding, not on PyPI, and needs librpm), and the file itself is
read by the SQLite that comes with Python. The file comes from an image, so from outside: it is opened
read-only in a private temporary folder with the schema untrusted (no function, view or trigger of the file
runs), and a file SQLite finds malformed is said, not a failure of the release.

rpm before 4.16 (RHEL, UBI, CentOS, Rocky and Alma 8 and before, Amazon Linux 2) kept the same header blobs in a
Berkeley DB hash file, ``Packages``: :func:`bdb_packages` reads it. By hand too: the Python standard library no
longer reads Berkeley DB files, and its bindings (``berkeleydb``, ``bsddb3``) need the C library built in. The
few structures read here (the metadata page, hash pages and their overflow chains) are the ones rpm's own
read-only backend (``bdb_ro``) and the Go scanners of container images read, every page number and offset checked
against the file.
"""

from __future__ import annotations

import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

NAME, VERSION, RELEASE, EPOCH, ARCH, SOURCERPM = 1000, 1001, 1002, 1003, 1022, 1044
INT32, STRING, STRING_ARRAY, I18NSTRING = 4, 6, 8, 9
MAX_ENTRIES = 1 << 16  # index entries of one header: a few hundred in real packages
MAX_PACKAGES = 200_000  # a full distribution installs a few thousand
MAX_STRING = 4096
NOT_SOFTWARE = ("gpg-pubkey",)  # rpm lists each imported signing key as a package of that name


@dataclass(frozen=True, kw_only=True)
class RpmPackage:
    name: str
    version: str  # VERSION-RELEASE, with EPOCH: before it when the package has one
    arch: str
    source_rpm: str


def packages(db: bytes, wal: bytes = b"") -> tuple[list[RpmPackage], str]:
    """The packages an ``rpmdb.sqlite`` (and its write-ahead log, which may hold the last transactions)
    lists, and what went wrong reading it ("" when nothing did)."""
    try:
        import sqlite3  # here, not at the top: a Python built without it still releases (this is said)
    except ImportError:
        return [], "this Python has no sqlite3 module"
    with tempfile.TemporaryDirectory(prefix="unibake-rpmdb-") as folder:
        path = Path(folder) / "rpmdb.sqlite"
        path.write_bytes(db)
        if wal:
            Path(f"{path}-wal").write_bytes(wal)
        try:
            con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            return [], f"not an SQLite database ({exc})"
        try:
            return _read(con)
        except sqlite3.Error as exc:
            return [], f"SQLite cannot read it ({exc})"
        finally:
            con.close()


def _read(con) -> tuple[list[RpmPackage], str]:
    import sqlite3  # (imported by packages, which calls this)

    con.execute("PRAGMA trusted_schema=OFF")
    con.execute("PRAGMA query_only=ON")
    kind = con.execute("SELECT type FROM sqlite_master WHERE name = 'Packages'").fetchone()
    if kind is None or kind[0] != "table":
        return [], "it has no Packages table, as rpm writes it"
    # untrusted as the schema is, SQLite still computes a generated column, with its built-in functions: a blob
    # of zeroblob(400000000) per row made an 8 kB file cost 4 GB of memory; so the table must be rpm's two plain
    # columns, and no value may be longer than a header may be
    columns = [(name.lower(), (kind or "").upper(), pk, hidden)
               for _cid, name, kind, _notnull, _default, pk, hidden in con.execute("PRAGMA table_xinfo(Packages)")]
    if sorted(columns) != [("blob", "BLOB", 0, 0), ("hnum", "INTEGER", 1, 0)]:
        return [], "its Packages table is not rpm's (hnum INTEGER PRIMARY KEY, blob BLOB; no other column)"
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_BLOB)
    return _listed(blob for (blob,) in con.execute("SELECT blob FROM Packages ORDER BY hnum"))


def _listed(blobs) -> tuple[list[RpmPackage], str]:
    """The packages the header blobs name, and how many blobs named none ("" when all did)."""
    found: list[RpmPackage] = []
    bad = 0
    for n, blob in enumerate(blobs):
        if n >= MAX_PACKAGES:
            return found, f"it lists more than {MAX_PACKAGES} packages: the first {MAX_PACKAGES} are listed"
        tags = _header(blob) if isinstance(blob, bytes) else None
        name, version = tags.get(NAME, "") if tags else "", tags.get(VERSION, "") if tags else ""
        if not name or not version:
            bad += 1
            continue
        if name in NOT_SOFTWARE:
            continue
        release, epoch = tags.get(RELEASE, ""), tags.get(EPOCH)
        full = f"{version}-{release}" if release else version
        found.append(RpmPackage(name=name, version=f"{epoch}:{full}" if isinstance(epoch, int) else full,
                                arch=str(tags.get(ARCH, "")), source_rpm=str(tags.get(SOURCERPM, ""))))
    return found, f"{bad} of its headers name no package and version" if bad else ""


_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*")


def _header(blob: bytes) -> dict[int, object] | None:
    """The tags of one header blob the SBOM reads; None when the blob is not a header."""
    if len(blob) < 8:
        return None
    entries, size = struct.unpack_from(">II", blob)
    start = 8 + 16 * entries
    if entries > MAX_ENTRIES or start + size > len(blob):
        return None
    data = blob[start:start + size]
    tags: dict[int, object] = {}
    for i in range(entries):
        tag, kind, offset, count = struct.unpack_from(">IIII", blob, 8 + 16 * i)
        if tag not in (NAME, VERSION, RELEASE, EPOCH, ARCH, SOURCERPM) or tag in tags or offset >= size:
            continue
        # each tag only of the type rpm writes it in (a name stored as a number reached the SBOM's names, which
        # are text: a TypeError traceback in the archive stage)
        if kind in (STRING, STRING_ARRAY, I18NSTRING) and tag != EPOCH:
            end = data.find(b"\0", offset, offset + MAX_STRING + 1)
            if end < 0:
                continue
            text = data[offset:end].decode("utf-8", "replace")
            if _PRINTABLE.fullmatch(text):  # a control character would reach the SBOM and the build log
                tags[tag] = text
        elif kind == INT32 and tag == EPOCH and count >= 1 and offset + 4 <= size:
            tags[tag] = struct.unpack_from(">i", data, offset)[0]
    return tags


# Berkeley DB's hash access method, as db 4 and 5 write it (db's dbinc/db_page.h names these)
HASH_MAGIC = 0x061561
P_HASH_UNSORTED, P_OVERFLOW, P_HASHMETA, P_HASH = 2, 7, 8, 13
H_KEYDATA, H_OFFPAGE = 1, 3
PAGE_HEADER = 26  # lsn (8), pgno, prev_pgno, next_pgno (4 each), entries, hf_offset (2 each), level, type (1 each)
MAX_BLOB = 64 << 20  # one package's header: a few kB to a few hundred kB in real packages


def bdb_packages(db: bytes) -> tuple[list[RpmPackage], str]:
    """The packages a Berkeley DB ``Packages`` file lists (rpm before 4.16), and what went wrong reading it
    ("" when nothing did). Its hash pages are read in file order (as rpm's ``bdb_ro`` does): each pair of items is
    a key (the header's number, native byte order) and a value (the header blob) held on the page or on a chain of
    overflow pages; key 0 holds rpm's next header number, not a package."""
    if len(db) < 512:
        return [], "it is not a Berkeley DB file (too short)"
    for order in ("<", ">"):
        if struct.unpack_from(order + "I", db, 12)[0] == HASH_MAGIC:
            break
    else:
        return [], "it is not a Berkeley DB hash file, as rpm writes its Packages"
    page_size, encrypted, kind = struct.unpack_from(order + "I", db, 20)[0], db[24], db[25]
    if page_size < 512 or page_size > 65536 or page_size & (page_size - 1) or kind != P_HASHMETA:
        return [], "its metadata page is not a Berkeley DB hash file's"
    if encrypted:
        return [], "it is encrypted"
    pages = len(db) // page_size
    blobs: list[bytes] = []
    problems: list[str] = []
    used: set[int] = set()  # the overflow pages read: each value's own (so all the values together fit in the file)
    for number in range(1, pages):
        page = memoryview(db)[number * page_size:(number + 1) * page_size]
        if page[25] not in (P_HASH, P_HASH_UNSORTED):
            continue
        entries = struct.unpack_from(order + "H", page, 20)[0]
        if PAGE_HEADER + 2 * entries > page_size:
            problems.append(f"page {number} lists more items than it can hold")
            continue
        offsets = struct.unpack_from(f"{order}{entries}H", page, PAGE_HEADER)
        for i in range(0, entries - 1, 2):
            key, value = _item(page, offsets, i, page_size), _item(page, offsets, i + 1, page_size)
            if key is None or value is None:
                problems.append(f"page {number} has an item outside it")
                continue
            if key[0] == H_KEYDATA and bytes(key[1:]) == bytes(4):
                continue  # rpm's record of the next header number
            blob = _value(db, order, page_size, pages, value, used)
            if isinstance(blob, str):
                problems.append(f"page {number}: {blob}")
            else:
                blobs.append(blob)
        if len(blobs) > MAX_PACKAGES:
            break
    found, bad = _listed(blobs)
    said = [*problems[:1], *([f"{len(problems)} items in all could not be read"] if len(problems) > 1 else []),
            *([bad] if bad else [])]
    return found, "; ".join(said)


def _item(page: memoryview, offsets: tuple[int, ...], i: int, page_size: int) -> memoryview | None:
    """Item ``i`` of a hash page: it runs from its offset to the previous item's (items fill the page from its end)."""
    start, end = offsets[i], (offsets[i - 1] if i else page_size)
    if start < PAGE_HEADER or start >= end or end > page_size:
        return None
    return page[start:end]


def _value(db: bytes, order: str, page_size: int, pages: int, item: memoryview, used: set[int]) -> bytes | str:
    """A value item's bytes: held on the page, or gathered along its chain of overflow pages, none of which an
    earlier value's chain (``used``, to which this one's are added) held: Berkeley DB gives each value its own,
    and a hostile file whose many small items all named one long chain made a copy of it for each (memory
    growing with the square of the file's size, gigabytes from a file of 600 kB)."""
    if item[0] == H_KEYDATA:
        return bytes(item[1:])
    if item[0] != H_OFFPAGE or len(item) < 12:
        return f"an item of type {item[0]}, which rpm does not write"
    number, total = struct.unpack_from(order + "II", item, 4)
    if total > MAX_BLOB:
        return f"a value of {total} bytes (more than {MAX_BLOB})"
    parts, held, seen = [], 0, set()
    while held < total:
        if not 0 < number < pages or number in seen:
            return "an overflow chain that leaves the file or runs in a circle"
        if number in used:
            return "an overflow chain through a page another value's chain holds (each value has its own)"
        seen.add(number)
        page = memoryview(db)[number * page_size:(number + 1) * page_size]
        length = struct.unpack_from(order + "H", page, 22)[0]  # an overflow page's hf_offset: the bytes it holds
        if page[25] != P_OVERFLOW or PAGE_HEADER + length > page_size or not length:
            return "an overflow chain through a page that is not an overflow page"
        parts.append(page[PAGE_HEADER:PAGE_HEADER + length])
        held += length
        number = struct.unpack_from(order + "I", page, 16)[0]
    if held != total:
        return f"an overflow chain of {held} bytes for a value of {total}"
    used.update(seen)
    return b"".join(parts)
