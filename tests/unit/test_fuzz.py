"""Property-based tests: the YAML loader and the archive parser never crash, whatever they are fed.

The number of examples is bounded (``UNIBAKE_FUZZ_EXAMPLES``, default 150 per property) so the
suite stays fast; raise it for a longer campaign.
"""

from __future__ import annotations

import os
import shutil
import string

import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.errors import ArchiveError
from unibake.imagetar import BLOCK, inspect_save_stream, parse_header
from unibake.schema import SCHEMA

from ..conftest import BUSYBOX_PRODUCT
from ..savefixtures import docker_layout, oci_layout

EXAMPLES = int(os.environ.get("UNIBAKE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])

KEYS = sorted(SCHEMA) + ["image", "source", "expect", "name", "version", "allow", "run", "x", "tp1", "<<"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["images/tune/tp1", "../x", "/etc", "tp1.yaml",
                                                           "product.yaml", "$HOME", "a\nb", "\x00"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)),
    max_leaves=20)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def yaml_text(doc) -> str:
    import yaml
    return yaml.safe_dump(doc, allow_unicode=True)


def fresh_product(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(BUSYBOX_PRODUCT, root / "p", ignore=shutil.ignore_patterns("dockerfiles"))
    return root / "p" / "profiles"


@FUZZ
@given(product=documents, profile=documents, merge_into_valid=st.booleans())
def test_any_yaml_gives_a_plan_or_one_input_error(tmp_path_factory, product, profile, merge_into_valid):
    profiles = fresh_product(tmp_path_factory)
    if merge_into_valid:  # mutate a valid file rather than replace it, to reach deeper checks
        import yaml
        base = yaml.safe_load((profiles / "product.yaml").read_text())
        base.update(product)
        product = base
    (profiles / "product.yaml").write_text(yaml_text(product))
    (profiles / "tp1.yaml").write_text(yaml_text(profile))
    try:
        make_plan(profiles, verify_lock=False)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc).strip()


@FUZZ
@given(text=st.text(alphabet=string.printable + "{}[]:-#&*!|>'\"%@`\x00\u00e9", max_size=300))
def test_any_text_as_yaml_gives_a_plan_or_one_input_error(tmp_path_factory, text):
    profiles = fresh_product(tmp_path_factory)
    (profiles / "tp2.yaml").write_text(text)
    try:
        make_plan(profiles, verify_lock=False)
    except InputError as exc:  # one line naming the file (YAML's own errors are several lines)
        assert "tp2.yaml" in str(exc) and "\n" not in str(exc).strip(), str(exc)


ARCHIVES = {"docker": docker_layout(), "oci": oci_layout(), "oci-gzip": oci_layout(gzip_layers=True)}
mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("zero"), st.integers(0, 10**6), st.integers(1, 600)),
)


def mutate(data: bytes, mutations) -> bytes:
    out = bytearray(data)
    for kind, at, value in mutations:
        if not out:
            break
        at %= len(out)
        if kind == "flip":
            out[at] ^= value
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = bytes([value]) * 7
        else:
            out[at:at + value] = bytes(len(out[at:at + value]))
    return bytes(out)


@FUZZ
@given(layout=st.sampled_from(sorted(ARCHIVES)), mutations=st.lists(mutation, min_size=1, max_size=3))
def test_a_corrupted_archive_is_refused_or_still_the_same_image(layout, mutations):
    """Never a traceback; never a different image. (Bytes the identity does not cover, such as a
    legacy VERSION file or tar padding, may change without consequence: SHA256SUMS covers those.)"""
    data, image_id, diff_ids = ARCHIVES[layout]
    try:
        saved = inspect_save_stream([mutate(data, mutations)])
    except ArchiveError as exc:
        assert str(exc)
        return
    assert saved.image_id == image_id and list(saved.diff_ids) == diff_ids


# --- the walker's header parser against the standard library's -----------------------------------

def _frombuf(block: bytes):
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        return type(exc)
    return (info.name, info.type, info.size, info.linkname, info.mode, info.uid, info.gid, int(info.mtime))


def _ours(block: bytes):
    try:
        h = parse_header(block)
    except tarfile.HeaderError as exc:
        return type(exc)
    return (h.name, h.type, h.size, h.linkname, h.mode, h.uid, h.gid, h.mtime)


def _reseal(block: bytearray) -> bytes:
    """The block with its checksum made right again, so a mutation reaches the other fields."""
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % (sum(block) & 0o777777)
    return bytes(block)


headers = st.builds(
    lambda name, kind, size, mode, uid, mtime, link, fmt: (name, kind, size, mode, uid, mtime, link, fmt),
    st.text(min_size=1, max_size=40) | st.lists(st.text("abc/é", min_size=1, max_size=30), min_size=3, max_size=9)
    .map("/".join), st.sampled_from([tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE,
                                                        tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE,
                                                        tarfile.CHRTYPE, b"Z"]),
    st.integers(0, 2**40), st.integers(0, 0o7777), st.integers(0, 2**24), st.integers(0, 2**34),
    st.text(max_size=120), st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))


@FUZZ
@given(headers, st.lists(st.tuples(st.integers(0, BLOCK - 1), st.integers(0, 255)), max_size=4), st.booleans())
def test_header_parser_reads_every_block_as_tarfile_does(spec, mutations, reseal):
    """A layer's headers are read by our own parser for speed: on every block tarfile writes (every
    format, long names, big numbers in base-256), and on those blocks damaged at random (then with
    the checksum made right again or not), it gives tarfile's fields or tarfile's error."""
    name, kind, size, mode, uid, mtime, link, fmt = spec
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.uid, info.mtime, info.linkname = kind, size, mode, uid, mtime, link
    try:
        data = info.tobuf(fmt, "utf-8", "surrogateescape")
    except ValueError:  # not writable in that format: nothing to compare
        return
    for i in range(0, len(data), BLOCK):  # the extended headers' blocks, then the entry's own
        block = bytearray(data[i:i + BLOCK])
        for at, value in mutations:
            block[at] = value
        block = _reseal(block) if reseal and mutations else bytes(block)
        assert _ours(block) == _frombuf(block)


@pytest.mark.parametrize("block", [
    bytes(BLOCK), b"\xff" * BLOCK, b"x" * BLOCK, b"\0" * (BLOCK - 1),
    _reseal(bytearray(tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[:124] + b"\x80" + b"\0" * 10 + b"\x01"
                      + tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[136:BLOCK])),  # a base-256 size
    _reseal(bytearray(tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[:124] + b"0000000_12\0"
                      + tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[135:BLOCK])),  # int() takes "_"
    _reseal(bytearray(tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[:124] + b"\x1c\x1c\x1c\x1c\x1c\x1c12\0\0\0\0"
                      + tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[136:BLOCK])),  # str.strip() takes \x1c
    _reseal(bytearray(tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[:124] + b"-0000000012\0"
                      + tarfile.TarInfo("a").tobuf(tarfile.USTAR_FORMAT)[136:BLOCK])),  # a negative size
    tarfile.TarInfo("d/" * 60 + "file").tobuf(tarfile.USTAR_FORMAT),  # a name split into prefix and name
    _reseal(bytearray(tarfile.TarInfo("d/" * 30).tobuf(tarfile.USTAR_FORMAT)[:156] + tarfile.AREGTYPE
                      + tarfile.TarInfo("d/" * 30).tobuf(tarfile.USTAR_FORMAT)[157:])),  # a V7 folder: "/" at the end
])
def test_header_parser_on_the_odd_blocks(block):
    """Blocks a generator rarely makes: empty, garbage, short, base-256, and numbers int() and
    tarfile read differently unless handed over."""
    assert _ours(block) == _frombuf(block)
