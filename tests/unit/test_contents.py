"""What the archive pass finds in an image's layers for the SBOM: packages, Python distributions and
the digests of the libraries under the install root, stacked as the engine stacks the layers."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest

from unibake.archive import write_archive
from unibake.contents import LayerInspector
from unibake.sbom import sbom_document

from ..savefixtures import docker_layout, oci_layout, tar_of

STATUS = b"""Package: bash
Status: install ok installed
Priority: required
Architecture: amd64
Version: 5.2.15-2+b7
Description: GNU Bourne Again SHell
 Bash is an sh-compatible command language interpreter.
 .
 It is a continuation line.

Package: libzstd1
Status: install ok installed
Architecture: amd64
Source: libzstd
Version: 1.5.4+dfsg2-5

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""

METADATA = b"""Metadata-Version: 2.1
Name: PyYAML
Version: 6.0.1
Summary: YAML parser

Name: Not-A-Header
Long description follows.
"""


def chunks(data: bytes, size: int = 1 << 16):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def inspect(layers: list[bytes], layout=docker_layout, tmp_path=None):
    data, image_id, diff_ids = layout(layers)
    archive = write_archive(chunks(data), tmp_path, "x.tar.zst", tag="demo:1",
                            inspector=LayerInspector("/opt/unibake"))
    return archive, diff_ids


def test_packages_python_distributions_and_library_digests_are_found_in_one_pass(tmp_path):
    kernel = os.urandom(300 << 10)  # above the spool threshold: read through the tee
    base = tar_of([("var/lib/dpkg/status", STATUS, None),
                   ("etc/os-release", b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
                    None),
                   ("usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info/METADATA", METADATA, None),
                   ("usr/lib/x86_64-linux-gnu/libzstd.so.1", b"\x7fELF outside the install root", None)])
    ours = tar_of([("opt/unibake/kernels/rmsnorm/librmsnorm.so", kernel, None),
                   ("opt/unibake/kernels/rmsnorm/librmsnorm.so.1", b"", {"type": tarfile.SYMTYPE,
                                                                          "linkname": "librmsnorm.so"}),
                   ("opt/unibake/engine/app.py", b"print()\n", None)])
    small = tar_of([("./opt/unibake/profiles/tp2/kernels/fa/libfa.so", b"\x7fELF small", None)])  # kept in memory
    archive, diff_ids = inspect([base, ours, small], tmp_path=tmp_path)
    contents = archive.contents
    assert contents.layers == 3 and contents.not_inspected == () and contents.problems == ()
    assert [(p.kind, p.name, p.version, p.arch, p.source) for p in contents.packages] == [
        ("deb", "bash", "5.2.15-2+b7", "amd64", ""), ("deb", "libzstd1", "1.5.4+dfsg2-5", "amd64", "libzstd"),
        ("pypi", "PyYAML", "6.0.1", "", "")]
    assert contents.packages[2].path == "/usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info"
    assert {p.layer for p in contents.packages} == {diff_ids[0]}
    assert [(lib.path, lib.sha256, lib.size, lib.layer) for lib in contents.libraries] == [
        ("/opt/unibake/kernels/rmsnorm/librmsnorm.so", hashlib.sha256(kernel).hexdigest(), len(kernel), diff_ids[1]),
        ("/opt/unibake/profiles/tp2/kernels/fa/libfa.so", hashlib.sha256(b"\x7fELF small").hexdigest(), 10,
         diff_ids[2])]
    assert (contents.os.id, contents.os.version_id, contents.os.pretty_name) == (
        "debian", "12", "Debian GNU/Linux 12 (bookworm)")


def test_a_package_whose_files_are_in_the_image_is_listed_whatever_its_dpkg_state(tmp_path):
    # a base image can install with dpkg --unpack (no postinst run): its files ship as any other's, and a
    # status that is not "installed" kept them out of the SBOM unsaid
    states = ["installed", "unpacked", "half-installed", "half-configured", "triggers-awaited", "triggers-pending",
              "config-files", "not-installed"]
    status = "\n".join(f"Package: p-{state}\nStatus: install ok {state}\nArchitecture: amd64\nVersion: 1\n"
                       for state in states).encode()
    archive, _ = inspect([tar_of([("var/lib/dpkg/status", status, None)])], tmp_path=tmp_path)
    assert [p.name for p in archive.contents.packages] == [f"p-{state}" for state in sorted(states[:6])]


def test_a_later_layer_replaces_whites_out_and_hides_what_lies_below(tmp_path):
    first = tar_of([("var/lib/dpkg/status", STATUS, None),
                    ("opt/unibake/kernels/a/liba.so", b"old a" * 20000, None),
                    ("opt/unibake/kernels/b/libb.so", b"b" * 100000, None),
                    ("opt/unibake/kernels/c/libc.so", b"c" * 100000, None),
                    ("opt/unibake/lib/libd.so", b"d" * 100000, None)])
    second = tar_of([("var/lib/dpkg/status", STATUS.split(b"\n\n")[0] + b"\n", None),  # libzstd1 removed
                     ("opt/unibake/kernels/a/liba.so", b"new a" * 20000, None),
                     ("opt/unibake/kernels/b/.wh.libb.so", b"", None),
                     ("opt/unibake/lib/.wh..wh..opq", b"", None),
                     ("opt/unibake/kernels/c/libc.so", b"", {"type": tarfile.SYMTYPE, "linkname": "/dev/null"})])
    archive, diff_ids = inspect([first, second], layout=oci_layout, tmp_path=tmp_path)
    contents = archive.contents
    assert [p.name for p in contents.packages] == ["bash"] and contents.packages[0].layer == diff_ids[1]
    assert [(lib.path, lib.sha256) for lib in contents.libraries] == [
        ("/opt/unibake/kernels/a/liba.so", hashlib.sha256(b"new a" * 20000).hexdigest())]


def test_a_hard_link_to_a_library_carries_its_digest(tmp_path):
    layer = tar_of([("opt/unibake/kernels/a/liba.so", b"a" * 70000, None),
                    ("opt/unibake/profiles/tp1/kernels/a/liba.so", b"",
                     {"type": tarfile.LNKTYPE, "linkname": "opt/unibake/kernels/a/liba.so"})])
    archive, _ = inspect([layer], tmp_path=tmp_path)
    digest = hashlib.sha256(b"a" * 70000).hexdigest()
    assert [(lib.path, lib.sha256) for lib in archive.contents.libraries] == [
        ("/opt/unibake/kernels/a/liba.so", digest), ("/opt/unibake/profiles/tp1/kernels/a/liba.so", digest)]


def test_a_layer_the_inspector_cannot_parse_is_reported_and_the_archive_is_still_written(tmp_path):
    layer = bytearray(tar_of([("a.bin", os.urandom(70000), None), ("var/lib/dpkg/status", STATUS, None)]))
    second = layer.index(b"var/lib/dpkg/status")
    layer[second + 148:second + 156] = b"garbage!"  # the second header's checksum
    data, _, diff_ids = oci_layout([bytes(layer)])
    archive = write_archive(chunks(data), tmp_path, "y.tar.zst", tag="demo:1", inspector=LayerInspector("/opt/x"))
    assert archive.contents.not_inspected == (diff_ids[0],) and archive.contents.packages == ()
    assert (tmp_path / "y.tar.zst").stat().st_size == archive.compressed_bytes


def test_a_layer_whose_header_the_engine_reads_otherwise_is_reported_not_listed_as_python_reads_it(tmp_path):
    # a size field NUL + octal is 0 to Python's tarfile and 512 to the engine (Go trims NULs first), as to GNU tar:
    # the engine takes the package list's header below as a.bin's content, and the SBOM listed a package the image
    # does not hold (or, laid out the other way, left out one it holds)
    import subprocess

    layer = bytearray(tar_of([("a.bin", b"", None), ("var/lib/dpkg/status", STATUS, None)]))
    layer[124:136] = b"\x000000001000\x00"
    layer[148:156] = b" " * 8
    layer[148:155] = b"%06o\0" % sum(layer[:512])
    listed = subprocess.run(["tar", "-t"], input=bytes(layer), capture_output=True).stdout.decode().split()
    assert listed[0] == "a.bin" and "var/lib/dpkg/status" not in listed  # what the engine's reader sees
    data, _, diff_ids = oci_layout([bytes(layer)])
    archive = write_archive(chunks(data), tmp_path, "y.tar.zst", tag="demo:1", inspector=LayerInspector("/opt/x"))
    assert archive.contents.not_inspected == (diff_ids[0],) and archive.contents.packages == ()


def test_a_package_list_behind_a_hard_link_or_a_symlink_is_said_not_silently_left_out(tmp_path):
    # a base image's author could otherwise keep its packages out of the SBOM (and out of its scanners)
    layer = tar_of([("aaa/status", STATUS, None),
                    ("var/lib/dpkg/status", b"", {"type": tarfile.LNKTYPE, "linkname": "aaa/status"}),
                    ("aaa/META", METADATA, None),
                    ("usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info/METADATA", b"",
                     {"type": tarfile.SYMTYPE, "linkname": "/aaa/META"}),
                    ("usr/lib/os-release", b"ID=debian\n", None),
                    ("etc/os-release", b"", {"type": tarfile.SYMTYPE, "linkname": "../usr/lib/os-release"})])
    archive, _ = inspect([layer], tmp_path=tmp_path)
    problems = archive.contents.problems
    assert "/var/lib/dpkg/status is a hard link to /aaa/status, not a file: the packages it lists are not in the " \
           "SBOM" in problems
    assert any(p.startswith("/usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info/METADATA is a link") for p in problems)
    assert not any("os-release" in p for p in problems)  # Debian's usual link is not worth a word


def test_a_file_name_that_is_not_utf8_is_written_visibly_not_as_a_lone_surrogate(tmp_path):
    name = os.fsdecode(b"usr/lib/python3/dist-packages/n\xff-1.0.dist-info/METADATA")
    archive, _ = inspect([tar_of([(name, METADATA, None)])], tmp_path=tmp_path)
    [package] = archive.contents.packages
    assert package.path == "/usr/lib/python3/dist-packages/n\\xff-1.0.dist-info"  # a backslash, then xff
    package.path.encode("utf-8")  # no lone surrogate: every JSON reader takes it


def test_a_folder_a_later_layer_makes_a_link_or_a_file_takes_what_lay_under_it_out_of_the_sbom(tmp_path):
    # `rm -rf /var/lib/dpkg /opt/unibake/lib && ln -s /alt /var/lib/dpkg && echo x > /opt/unibake/lib`: the
    # engine records the new entries only, no whiteouts; the image holds neither the packages nor the library
    first = tar_of([("var/lib/dpkg/status", STATUS, None),
                    ("opt/unibake/lib/libghost.so", b"ghost" * 20000, None),
                    ("opt/unibake/kernels/a/liba.so", b"a" * 100, None),
                    ("usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info/METADATA", METADATA, None)])
    second = tar_of([("alt/status", b"Package: realpkg\nStatus: install ok installed\nVersion: 9\n", None),
                     ("var/lib/dpkg", b"", {"type": tarfile.SYMTYPE, "linkname": "/alt"}),
                     ("opt/unibake/lib", b"x\n", None),
                     ("usr/lib/python3/dist-packages", b"", {"type": tarfile.SYMTYPE, "linkname": "../elsewhere"})])
    archive, diff_ids = inspect([first, second], tmp_path=tmp_path)
    contents = archive.contents
    assert contents.packages == ()
    assert [lib.path for lib in contents.libraries] == ["/opt/unibake/kernels/a/liba.so"]
    assert contents.problems == ("/var/lib/dpkg is a link to /alt, not a folder: the packages listed under it are "
                                 "not in the SBOM",)


def test_a_library_that_is_a_hard_link_to_another_file_is_listed_with_that_files_digest(tmp_path):
    # `ln /opt/unibake/aaa/blob /opt/unibake/lib/libhl.so`: the tar holds the content under blob's name only
    layer = tar_of([("opt/unibake/aaa/blob", b"lib" * 30000, None),
                    ("usr/share/outside", b"outside", None),
                    ("opt/unibake/lib/libhl.so", b"", {"type": tarfile.LNKTYPE, "linkname": "opt/unibake/aaa/blob"}),
                    ("opt/unibake/lib/libout.so", b"", {"type": tarfile.LNKTYPE, "linkname": "usr/share/outside"}),
                    ("opt/unibake/lib/libplain.so", b"other", None)])
    archive, _ = inspect([layer], tmp_path=tmp_path)
    contents = archive.contents
    assert [(lib.path, lib.sha256) for lib in contents.libraries] == [
        ("/opt/unibake/lib/libhl.so", hashlib.sha256(b"lib" * 30000).hexdigest()),
        ("/opt/unibake/lib/libout.so", ""),  # its content lies outside the install root: not read, but listed
        ("/opt/unibake/lib/libplain.so", hashlib.sha256(b"other").hexdigest())]
    assert contents.problems == ("/opt/unibake/lib/libout.so is a hard link to /usr/share/outside, which was not "
                                 "read: it is listed without its sha256",)
    document = json.loads(sbom_document(
        product="p", release="1", tag="p:1", version="1", image_id="sha256:" + "0" * 64, diff_ids=("l",),
        components=(), contents=contents, base=None, engine_version="", install_root="/opt/unibake", epoch=0))
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    assert "hashes" not in by_ref["file:/opt/unibake/lib/libout.so"]
    assert by_ref["file:/opt/unibake/lib/libhl.so"]["hashes"][0]["content"] == hashlib.sha256(b"lib" * 30000).hexdigest()


def test_a_python_distribution_folder_that_is_a_link_is_said_not_silently_left_out(tmp_path):
    # importlib.metadata (pip, Python) reads a distribution through the link; the SBOM cannot: a base
    # image's author could otherwise keep a package out of it unsaid
    layer = tar_of([("aaa/META/METADATA", METADATA, None),
                    ("usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info", b"",
                     {"type": tarfile.SYMTYPE, "linkname": "/aaa/META"}),
                    ("usr/lib/python3/dist-packages/evil-1.0.egg-info", b"",
                     {"type": tarfile.SYMTYPE, "linkname": "/aaa/META/METADATA"}),
                    ("usr/lib/python3/dist-packages/egg2-1.0-py3.11.egg", b"",
                     {"type": tarfile.SYMTYPE, "linkname": "/aaa/x.egg"})])
    archive, _ = inspect([layer], tmp_path=tmp_path)
    assert archive.contents.packages == ()
    assert archive.contents.problems == tuple(
        f"/usr/lib/python3/dist-packages/{name} is a link to {target}: the Python package behind it is not in the SBOM"
        for name, target in (("PyYAML-6.0.1.dist-info", "/aaa/META"), ("evil-1.0.egg-info", "/aaa/META/METADATA"),
                             ("egg2-1.0-py3.11.egg", "/aaa/x.egg")))


def test_the_texts_kept_of_all_layers_together_are_bounded_and_what_is_left_unread_is_said(tmp_path, monkeypatch):
    # each package list is read up to 64 MiB, but their number was not bounded: a hundred 60 MiB files
    # of zeros (a few MB to pull) were held together, 6 GB; the bound here is the same rule, made small
    from unibake import contents

    monkeypatch.setattr(contents, "KEPT_LIMIT", 3000)
    stanza = b"Package: p%d\nStatus: install ok installed\nVersion: 1\n" + b"Description: x\n" + b" pad\n" * 200
    first = tar_of([(f"var/lib/dpkg/status.d/p{n}", stanza % n, None) for n in range(2)])
    second = tar_of([(f"var/lib/dpkg/status.d/p{n}", stanza % n, None) for n in range(2, 4)])
    archive, _ = inspect([first, second], tmp_path=tmp_path)
    kept = [p.name for p in archive.contents.packages]
    assert kept == ["p0", "p1"] and len(stanza) * 2 < 3000 < len(stanza) * 3
    assert [p.split(" MiB")[0].rsplit(" ", 1)[0] for p in archive.contents.problems] == [
        f"/var/lib/dpkg/status.d/p{n} is not read: the package lists and metadata read before it already hold"
        for n in (2, 3)]


@pytest.mark.parametrize("form", ["gnu magic", "star trailer"])
def test_a_package_list_named_through_a_tar_prefix_the_engine_reads_otherwise_is_the_one_read(tmp_path, form):
    # a base's second layer holds the real dpkg status under GNU magic, its prefix field "0": the engine
    # (Go's archive/tar) reads that field as an access time and unpacks var/lib/dpkg/status; Python's
    # tarfile read 0/var/lib/dpkg/status, and the SBOM listed the decoy of the first layer. With a star
    # trailer Go reads 131 bytes of prefix, Python 155 (the star times after it too)
    decoy = tar_of([("var/lib/dpkg/status", b"Package: decoy\nStatus: install ok installed\nVersion: 1\n", None)])
    real = b"Package: hidden\nStatus: install ok installed\nVersion: 6.6\n"
    info = tarfile.TarInfo("var/lib/dpkg/status" if form == "gnu magic" else "status")
    info.size = len(real)
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT if form == "gnu magic" else tarfile.USTAR_FORMAT)[:512])
    if form == "gnu magic":
        header[345:346] = b"0"
    else:
        header[345:476] = b"var/lib/" + b"/" * 119 + b"dpkg"
        header[476:500] = b"00000000000 00000000000 "
        header[508:512] = b"tar\0"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    second = bytes(header) + real + b"\0" * (-len(real) % 512 + 1024)
    with tarfile.open(fileobj=__import__("io").BytesIO(second)) as tar:
        assert tar.getnames()[0] != "var/lib/dpkg/status"  # what Python reads
    archive, _ = inspect([decoy, second], tmp_path=tmp_path)
    assert [p.name for p in archive.contents.packages] == ["hidden"]


def test_a_package_list_named_through_a_prefix_after_a_pax_header_without_a_path_is_the_one_read(tmp_path):
    # as above, the real dpkg status under GNU magic with the prefix field "0", after a pax header that
    # sets no path (a comment): the engine still reads the name without the prefix; the SBOM took any pax
    # header for one that names the member, read 0/var/lib/dpkg/status, and listed the decoy
    decoy = tar_of([("var/lib/dpkg/status", b"Package: decoy\nStatus: install ok installed\nVersion: 1\n", None)])
    real = b"Package: hidden\nStatus: install ok installed\nVersion: 6.6\n"
    info = tarfile.TarInfo("var/lib/dpkg/status")
    info.size = len(real)
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT)[:512])
    header[345:346] = b"0"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    record = b"13 comment=x\n"
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, len(record)
    second = pax.tobuf(tarfile.USTAR_FORMAT) + record + bytes(-len(record) % 512) + bytes(header) + real + \
        b"\0" * (-len(real) % 512 + 1024)
    with tarfile.open(fileobj=__import__("io").BytesIO(second)) as tar:
        assert tar.getnames() == ["0/var/lib/dpkg/status"]  # what Python reads
    archive, _ = inspect([decoy, second], tmp_path=tmp_path)
    assert [p.name for p in archive.contents.packages] == ["hidden"]


@pytest.mark.parametrize("name", [".wh..wh..opq", "./.wh..wh..opq"])
def test_an_opaque_whiteout_at_a_layers_root_hides_everything_the_layers_below_held(tmp_path, name):
    # the OCI image spec applies an opaque whiteout to the folder it lies in, the root included: the
    # SBOM listed the first layer's packages and library as if they were still in the image
    first = tar_of([("var/lib/dpkg/status", STATUS, None),
                    ("etc/os-release", b"ID=debian\nVERSION_ID=12\n", None),
                    ("opt/unibake/kernels/a/liba.so", b"old a" * 20000, None)])
    second = tar_of([(name, b"", None),
                     ("var/lib/dpkg/status", b"Package: kept\nStatus: install ok installed\nVersion: 2\n", None),
                     ("opt/unibake/kernels/b/libb.so", b"b" * 100, None)])
    archive, diff_ids = inspect([first, second], layout=oci_layout, tmp_path=tmp_path)
    contents = archive.contents
    assert [(p.name, p.layer) for p in contents.packages] == [("kept", diff_ids[1])]  # its own layer's entries stay
    assert [lib.path for lib in contents.libraries] == ["/opt/unibake/kernels/b/libb.so"]
    assert contents.os is None


def test_stacking_many_whiteouts_over_many_packages_takes_time_in_proportion(tmp_path):
    # each whiteout (and opaque folder) was compared with every path kept so far: 8000 of each took 46 s,
    # this test minutes, tens of thousands (a conda base, then `conda clean`) hours; now each finds its paths
    import time

    from unibake.contents import _LayerReader, _stack

    n = 10000
    metadata = b"Metadata-Version: 2.1\nName: p\nVersion: 1\n"
    layers = [tar_of([(f"usr/lib/python3/dist-packages/p{i}-1.dist-info/METADATA", metadata, None) for i in range(n)]
                     + [("usr/lib/python3/dist-packages/zz-1.dist-info/METADATA", metadata, None)]),
              tar_of([(f"srv/x{i}/.wh.w", b"", None) for i in range(n)] +
                     [(f"srv/y{i}/.wh..wh..opq", b"", None) for i in range(n)] +
                     [("usr/lib/python3/dist-packages/.wh.p7-1.dist-info", b"", None),
                      ("usr/lib/python3/dist-packages/zz-1.dist-info/.wh..wh..opq", b"", None)])]
    found = []
    for data in layers:
        reader = _LayerReader("opt/unibake/", found.append)
        reader.write(memoryview(data))
        reader.close()
    start = time.monotonic()
    contents = _stack([("a", found[0]), ("b", found[1])], 2, ())
    assert time.monotonic() - start < 10, time.monotonic() - start
    assert len(contents.packages) == n - 1 and not any(p.path.endswith(("/p7-1.dist-info", "/zz-1.dist-info"))
                                                       for p in contents.packages)


def test_a_second_entry_of_one_name_in_a_layer_replaces_the_first_as_the_engine_unpacks_it(tmp_path):
    # the engine unpacks a layer entry by entry, removing what a name held before (a folder with its
    # contents) unless both are folders: the SBOM kept the first entry's packages and library
    layer = tar_of([("var/lib/dpkg/status", b"Package: decoy\nStatus: install ok installed\nVersion: 1\n", None),
                    ("var/lib/dpkg/status", b"", {"type": tarfile.SYMTYPE, "linkname": "/elsewhere/status"}),
                    ("usr/lib/python3/dist-packages/gone-1.dist-info/METADATA", METADATA, None),
                    ("usr/lib/python3/dist-packages/gone-1.dist-info", b"",
                     {"type": tarfile.SYMTYPE, "linkname": "/aaa"}),
                    ("usr/lib/python3/dist-packages/kept-1.dist-info/METADATA", METADATA, None),
                    ("usr/lib/python3/dist-packages/kept-1.dist-info", None, None),  # a folder again: merged
                    ("opt/unibake/kernels/a/liba.so", b"first" * 100, None),
                    ("opt/unibake/kernels/a/liba.so", b"", {"type": tarfile.SYMTYPE, "linkname": "/dev/null"}),
                    ("opt/unibake/kernels/b/libb.so", b"first" * 100, None),
                    ("opt/unibake/kernels/b/libb.so", b"second" * 100, None)])
    archive, _ = inspect([layer], tmp_path=tmp_path)
    contents = archive.contents
    assert [p.path for p in contents.packages] == ["/usr/lib/python3/dist-packages/kept-1.dist-info"]
    assert [(lib.path, lib.sha256) for lib in contents.libraries] == [
        ("/opt/unibake/kernels/b/libb.so", hashlib.sha256(b"second" * 100).hexdigest())]
    assert "/var/lib/dpkg/status is a link or a folder, not a file: the packages it lists are not in the SBOM" in \
        contents.problems


def test_what_cannot_be_listed_is_said_one_by_one_up_to_a_bound_and_the_rest_counted(tmp_path, monkeypatch):
    # a base of as many links named like Python packages as it likes made as many lines, held in memory
    # and written into the SBOM (the bound made small here: the rule is the same)
    from unibake import contents

    monkeypatch.setattr(contents, "PROBLEM_LIMIT", 50)
    links = [(f"usr/lib/python3/dist-packages/p{i}-1.dist-info", b"", {"type": tarfile.SYMTYPE, "linkname": "/x"})
             for i in range(120)]
    archive, _ = inspect([tar_of(links[:60]), tar_of(links[60:])], tmp_path=tmp_path)
    problems = archive.contents.problems
    assert len(problems) == 51 and problems[-1] == "and 70 more like those above: not said one by one"
    assert problems[0].startswith("/usr/lib/python3/dist-packages/p0-1.dist-info is a link to /x")
