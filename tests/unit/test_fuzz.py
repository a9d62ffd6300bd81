"""Property-based tests: the YAML loader and the archive parser never crash, whatever they are fed.

The number of examples is bounded (``UNIBAKE_FUZZ_EXAMPLES``, default 150 per property) so the
suite stays fast; raise it for a longer campaign.
"""

from __future__ import annotations

import io
import os
import shutil
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.errors import ArchiveError
from unibake.imagetar import inspect_save_stream
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
    except InputError:
        pass


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
