"""RPM's SQLite database in the SBOM: a base of RHEL/UBI 9, Rocky, Fedora or Amazon Linux 2023 lists its
packages (before: "an RPM database, which unibake does not read", and no OS package in the SBOM)."""

from __future__ import annotations

import gzip
import sqlite3
import struct
from pathlib import Path

from unibake import rpmdb

from ..savefixtures import sha, tar_of
from .test_sbom import document_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rpmdb"
UBI = b'NAME="Red Hat Enterprise Linux"\nID="rhel"\nVERSION_ID="9.4"\n'


def real_db() -> bytes:
    """rpmdb.sqlite as rpm 4.18 wrote it (tests/fixtures/rpmdb/README.md says how)."""
    return gzip.decompress((FIXTURES / "rpmdb.sqlite.gz").read_bytes())


def test_the_packages_rpm_installed_are_read_from_its_sqlite_database():
    found, problem = rpmdb.packages(real_db())
    assert problem == ""
    assert sorted((p.name, p.version, p.arch, p.source_rpm) for p in found) == [
        ("demo-cuda-runtime", "2:12.4.1-1.el9", "noarch", "demo-cuda-runtime-12.4.1-1.el9.src.rpm"),
        ("libnccl", "2.21.5-1+cuda12.4", "noarch", "libnccl-2.21.5-1+cuda12.4.src.rpm")]


def test_an_rpm_base_s_packages_are_in_the_sbom_with_the_purl_spec_s_rpm_form(tmp_path):
    layer = tar_of([("etc/os-release", UBI, None), ("var/lib/rpm/rpmdb.sqlite", real_db(), None)])
    contents, document = document_of([layer], tmp_path)
    assert contents.problems == ()
    assert [(p.kind, p.name, p.version, p.path) for p in contents.packages] == [
        ("rpm", "demo-cuda-runtime", "2:12.4.1-1.el9", "/var/lib/rpm/rpmdb.sqlite"),
        ("rpm", "libnccl", "2.21.5-1+cuda12.4", "/var/lib/rpm/rpmdb.sqlite")]
    purls = sorted(c["purl"] for c in document["components"] if c.get("purl", "").startswith("pkg:rpm/"))
    assert purls == ["pkg:rpm/rhel/demo-cuda-runtime@12.4.1-1.el9?arch=noarch&distro=rhel-9.4&epoch=2",
                     "pkg:rpm/rhel/libnccl@2.21.5-1%2Bcuda12.4?arch=noarch&distro=rhel-9.4"]


def test_packages_still_in_the_write_ahead_log_are_read_and_a_later_layer_s_database_replaces_the_base_s(tmp_path):
    # rpm writes in WAL mode: a transaction not yet checkpointed lies in rpmdb.sqlite-wal beside the file
    work = tmp_path / "db"
    work.mkdir()
    (work / "rpmdb.sqlite").write_bytes(real_db())
    con = sqlite3.connect(work / "rpmdb.sqlite")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    blob = con.execute("SELECT blob FROM Packages ORDER BY hnum LIMIT 1").fetchone()[0]
    con.execute("INSERT INTO Packages (blob) VALUES (?)", (blob.replace(b"libnccl\0", b"libnvjx\0", 1),))
    con.commit()
    db, wal = (work / "rpmdb.sqlite").read_bytes(), (work / "rpmdb.sqlite-wal").read_bytes()
    con.close()
    assert wal  # the new row is in the log only
    assert sorted(p.name for p in rpmdb.packages(db, wal)[0]) == ["demo-cuda-runtime", "libnccl", "libnvjx"]
    base = tar_of([("etc/os-release", UBI, None), ("var/lib/rpm/rpmdb.sqlite", real_db(), None)])
    update = tar_of([("var/lib/rpm/rpmdb.sqlite", db, None), ("var/lib/rpm/rpmdb.sqlite-wal", wal, None)])
    (tmp_path / "sbom").mkdir()
    contents, _ = document_of([base, update], tmp_path / "sbom")
    assert sorted(p.name for p in contents.packages) == ["demo-cuda-runtime", "libnccl", "libnvjx"]
    assert {p.layer for p in contents.packages} == {f"sha256:{sha(update)}"}  # the update's database, not the base's


def test_a_damaged_or_hostile_rpm_database_is_said_not_a_failure(tmp_path):
    # not a database, a cut one, and one whose Packages is a view: said, the release goes on; a header whose
    # offsets point outside its data, or whose name holds a control character, is counted, not read
    cut = real_db()[:4096]
    assert rpmdb.packages(b"SQLite format 3\x00" + bytes(100))[1].startswith("SQLite cannot read it")
    assert rpmdb.packages(cut)[1] == "SQLite cannot read it (database disk image is malformed)"
    view = tmp_path / "view.sqlite"
    con = sqlite3.connect(view)
    con.execute("CREATE TABLE t (hnum INTEGER, blob BLOB)")
    con.execute("CREATE VIEW Packages AS SELECT hnum, blob FROM t")
    con.commit()
    con.close()
    assert rpmdb.packages(view.read_bytes()) == ([], "it has no Packages table, as rpm writes it")
    evil = tmp_path / "evil.sqlite"
    (evil).write_bytes(real_db())
    con = sqlite3.connect(evil)
    con.execute("PRAGMA journal_mode=DELETE")
    outside = struct.pack(">II", 1, 4) + struct.pack(">IIII", 1000, 6, 1 << 30, 1) + b"abc\0"
    control = struct.pack(">II", 2, 16) + struct.pack(">IIII", 1000, 6, 0, 1) + struct.pack(">IIII", 1001, 6, 8, 1) \
        + b"a\x1b[2J\0\0\0\0\x001.0\0\0\0\0\0"
    huge = struct.pack(">II", 0xFFFFFFFF, 0)
    for blob in (outside, control, huge, b"", "text, not a blob"):
        con.execute("INSERT INTO Packages (blob) VALUES (?)", (blob,))
    con.commit()
    con.close()
    found, problem = rpmdb.packages(evil.read_bytes())
    assert sorted(p.name for p in found) == ["demo-cuda-runtime", "libnccl"]
    assert problem == "5 of its headers name no package and version"
    layer = tar_of([("var/lib/rpm/rpmdb.sqlite", cut, None)])
    (tmp_path / "sbom").mkdir()
    contents, _ = document_of([layer], tmp_path / "sbom")
    assert contents.packages == () and contents.problems == (
        "/var/lib/rpm/rpmdb.sqlite could not be read: SQLite cannot read it (database disk image is malformed); "
        "the packages it lists are not in the SBOM",)


def bdb(name: str) -> bytes:
    """A Berkeley DB ``Packages`` as db 5.3's db_load wrote it (tests/fixtures/rpmdb/README.md says how)."""
    return gzip.decompress((FIXTURES / name).read_bytes())


def test_the_packages_of_an_rhel_8_base_are_read_from_its_berkeley_db(tmp_path):
    # rpm's own bdb_ro backend lists the same two packages from this file (README.md); before: "an RPM database,
    # which unibake does not read", and no OS package in the SBOM of a UBI 8 or RHEL 8 based image
    found, problem = rpmdb.bdb_packages(bdb("Packages.gz"))
    assert problem == ""
    assert sorted((p.name, p.version, p.arch, p.source_rpm) for p in found) == [
        ("demo-cuda-runtime", "2:12.4.1-1.el9", "noarch", "demo-cuda-runtime-12.4.1-1.el9.src.rpm"),
        ("libnccl", "2.21.5-1+cuda12.4", "noarch", "libnccl-2.21.5-1+cuda12.4.src.rpm")]
    layer = tar_of([("etc/os-release", b'ID="rhel"\nVERSION_ID="8.10"\n', None),
                    ("var/lib/rpm/Packages", bdb("Packages.gz"), None)])
    contents, document = document_of([layer], tmp_path)
    assert contents.problems == ()
    assert sorted(c["purl"] for c in document["components"] if c.get("purl", "").startswith("pkg:rpm/")) == [
        "pkg:rpm/rhel/demo-cuda-runtime@12.4.1-1.el9?arch=noarch&distro=rhel-8.10&epoch=2",
        "pkg:rpm/rhel/libnccl@2.21.5-1%2Bcuda12.4?arch=noarch&distro=rhel-8.10"]


def test_a_big_endian_berkeley_db_of_small_pages_is_read_along_its_overflow_chains():
    # 200 headers on 512-byte pages: many hash pages, each header on a chain of overflow pages, all big-endian
    found, problem = rpmdb.bdb_packages(bdb("Packages-be512.gz"))
    assert problem == ""
    assert sorted(p.name for p in found) == [f"lib{i:04d}" for i in range(200)]


def _page(db: bytes, number: int) -> int:
    return number * struct.unpack_from(">I", db, 20)[0]


def _overflow_value(db: bytes, pages: list[int]) -> tuple[int, int, int]:
    """The first value held on overflow pages: its hash page's offset, its index there, its own offset."""
    for n in pages:
        start = _page(db, n)
        for i in range(1, struct.unpack_from(">H", db, start + 20)[0], 2):
            item = start + struct.unpack_from(">H", db, start + 26 + 2 * i)[0]
            if db[item] == 3:  # H_OFFPAGE
                return start, i, item
    raise AssertionError("no value on overflow pages")


def test_a_damaged_or_hostile_berkeley_db_is_said_not_a_failure(tmp_path):
    good = bdb("Packages-be512.gz")
    size = struct.unpack_from(">I", good, 20)[0]
    assert rpmdb.bdb_packages(b"") == ([], "it is not a Berkeley DB file (too short)")
    assert rpmdb.bdb_packages(bytes(4096)) == ([], "it is not a Berkeley DB hash file, as rpm writes its Packages")
    btree = bytearray(good)
    btree[25] = 9  # a btree's metadata page
    assert rpmdb.bdb_packages(bytes(btree)) == ([], "its metadata page is not a Berkeley DB hash file's")
    odd = bytearray(good)
    odd[20:24] = struct.pack(">I", 1000)
    assert rpmdb.bdb_packages(bytes(odd)) == ([], "its metadata page is not a Berkeley DB hash file's")
    secret = bytearray(good)
    secret[24] = 1
    assert rpmdb.bdb_packages(bytes(secret)) == ([], "it is encrypted")
    # cut in its middle: the headers whose chains leave the file are counted, the others read
    found, problem = rpmdb.bdb_packages(good[:len(good) // 2])
    assert 0 < len(found) < 200 and problem.startswith("page ") and "leaves the file or runs in a circle" in problem
    # an overflow chain that loops back on itself, a value whose length is absurd, and an item outside its page
    pages = [n for n in range(1, len(good) // size) if good[_page(good, n) + 25] == 13]
    looped, huge, outside = bytearray(good), bytearray(good), bytearray(good)
    first_overflow = next(n for n in range(1, len(good) // size) if good[_page(good, n) + 25] == 7)
    looped[_page(good, first_overflow) + 16:_page(good, first_overflow) + 20] = struct.pack(">I", first_overflow)
    start, index, item = _overflow_value(good, pages)
    huge[item + 8:item + 12] = struct.pack(">I", 1 << 31)
    outside[start + 26 + 2 * index:start + 28 + 2 * index] = struct.pack(">H", 0xFFFF)
    for damaged, said in ((looped, "overflow chain"), (huge, f"a value of {1 << 31} bytes"),
                          (outside, "has an item outside it")):
        found, problem = rpmdb.bdb_packages(bytes(damaged))
        assert len(found) < 200 and said in problem, problem
    layer = tar_of([("var/lib/rpm/Packages", bytes(huge), None)])
    contents, _ = document_of([layer], tmp_path)
    assert len(contents.packages) == 199 and contents.problems == (
        f"/var/lib/rpm/Packages was read in part: page {start // size}: a value of {1 << 31} bytes (more than "
        f"{64 << 20}); the 199 packages read are in the SBOM, the others it lists are not",)


def test_values_that_name_one_overflow_chain_are_read_once_not_copied_for_each():
    # found by review: many small items naming one long chain were each a copy of it (600 kB of file, gigabytes
    # of memory); Berkeley DB gives each value its own chain, so a second value on a chain is a problem said
    good = bdb("Packages-be512.gz")
    size = struct.unpack_from(">I", good, 20)[0]
    pages = [n for n in range(1, len(good) // size) if good[_page(good, n) + 25] == 13]
    offpage = []  # every value held on overflow pages: where its (first page, length) lie
    for n in pages:
        start = _page(good, n)
        for i in range(1, struct.unpack_from(">H", good, start + 20)[0], 2):
            item = start + struct.unpack_from(">H", good, start + 26 + 2 * i)[0]
            if good[item] == 3:
                offpage.append(item)
    assert len(offpage) > 100
    shared = bytearray(good)
    for item in offpage[1:]:  # every value names the first one's chain
        shared[item + 4:item + 12] = good[offpage[0] + 4:offpage[0] + 12]
    found, problem = rpmdb.bdb_packages(bytes(shared))
    assert len(found) == 200 - len(offpage) + 1, len(found)
    assert "an overflow chain through a page another value's chain holds" in problem
    assert f"{len(offpage) - 1} items in all could not be read" in problem

def test_a_package_name_stored_as_a_number_is_counted_as_naming_none_not_a_traceback(tmp_path):
    # found by probing: a header whose NAME tag is an INT32 gave the SBOM an int for a name, and the archive stage
    # ended in a TypeError traceback (exit 1); each tag is now read only in the type rpm writes it in
    evil = tmp_path / "evil.sqlite"
    evil.write_bytes(real_db())
    con = sqlite3.connect(evil)
    con.execute("PRAGMA journal_mode=DELETE")
    number = struct.pack(">II", 2, 8) + struct.pack(">IIII", 1000, 4, 0, 1) + struct.pack(">IIII", 1001, 6, 4, 1) \
        + struct.pack(">i", 7) + b"1.0\0"
    epoch_as_text = struct.pack(">II", 3, 10) + struct.pack(">IIII", 1000, 6, 0, 1) \
        + struct.pack(">IIII", 1001, 6, 2, 1) + struct.pack(">IIII", 1003, 6, 6, 1) + b"a\x001.0\x002\0\0\0"
    for blob in (number, epoch_as_text):
        con.execute("INSERT INTO Packages (blob) VALUES (?)", (blob,))
    con.commit()
    con.close()
    found, problem = rpmdb.packages(evil.read_bytes())
    assert sorted((p.name, p.version) for p in found) == [("a", "1.0"), ("demo-cuda-runtime", "2:12.4.1-1.el9"),
                                                          ("libnccl", "2.21.5-1+cuda12.4")]
    assert problem == "1 of its headers name no package and version"
    layer = tar_of([("etc/os-release", UBI, None), ("var/lib/rpm/rpmdb.sqlite", evil.read_bytes(), None)])
    (tmp_path / "sbom").mkdir()
    contents, document = document_of([layer], tmp_path / "sbom")
    assert sorted(p.name for p in contents.packages) == ["a", "demo-cuda-runtime", "libnccl"]


def test_a_packages_table_whose_blobs_sqlite_computes_is_refused_unread(tmp_path):
    # found by probing: an 8 kB database whose Packages.blob is a generated column, zeroblob(400000000), cost the
    # archive stage 4 GB of memory (trusted_schema=OFF leaves SQLite's own functions to generated columns)
    for schema in ("hnum INTEGER, n INTEGER, blob BLOB GENERATED ALWAYS AS (zeroblob(n)) VIRTUAL",
                   "hnum INTEGER PRIMARY KEY, n INTEGER, blob BLOB AS (zeroblob(n)) STORED",
                   "hnum TEXT PRIMARY KEY, blob BLOB", "hnum INTEGER PRIMARY KEY, blob BLOB, extra TEXT"):
        path = tmp_path / "bomb.sqlite"
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        con.execute(f"CREATE TABLE Packages ({schema})")
        if " n " in schema:
            con.executemany("INSERT INTO Packages (hnum, n) VALUES (?, ?)", [(i, 1000) for i in range(6)])
        con.commit()
        con.close()
        assert rpmdb.packages(path.read_bytes()) == (
            [], "its Packages table is not rpm's (hnum INTEGER PRIMARY KEY, blob BLOB; no other column)"), schema
