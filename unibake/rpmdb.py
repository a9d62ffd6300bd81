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
    con.execute("PRAGMA trusted_schema=OFF")
    con.execute("PRAGMA query_only=ON")
    kind = con.execute("SELECT type FROM sqlite_master WHERE name = 'Packages'").fetchone()
    if kind is None or kind[0] != "table":
        return [], "it has no Packages table, as rpm writes it"
    found: list[RpmPackage] = []
    bad = 0
    for n, (blob,) in enumerate(con.execute("SELECT blob FROM Packages ORDER BY hnum")):
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
        if kind in (STRING, STRING_ARRAY, I18NSTRING):
            end = data.find(b"\0", offset, offset + MAX_STRING + 1)
            if end < 0:
                continue
            text = data[offset:end].decode("utf-8", "replace")
            if _PRINTABLE.fullmatch(text):  # a control character would reach the SBOM and the build log
                tags[tag] = text
        elif kind == INT32 and count >= 1 and offset + 4 <= size:
            tags[tag] = struct.unpack_from(">i", data, offset)[0]
    return tags
