"""Both `docker save` layouts read by imagetar: identity recomputed, corruption and tricks refused."""

from __future__ import annotations

import io

import pytest

from unibake.errors import ArchiveError
from unibake.imagetar import check_against, inspect_save_stream

from ..savefixtures import DEFAULT_LAYERS, _archive, docker_layout, layer_tar, oci_layout


def inspect(data: bytes):
    return inspect_save_stream(chunks_of(data))


def chunks_of(data: bytes, size: int = 4096):
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("build", [docker_layout, oci_layout,
                                   lambda: oci_layout(gzip_layers=True),
                                   lambda: oci_layout(with_docker_manifest=False)],
                         ids=["docker-20.10", "oci", "oci-gzip-layers", "oci-index-only"])
def test_identity_is_recomputed_in_both_layouts(build):
    data, image_id, diff_ids = build()
    saved = inspect(data)
    assert saved.image_id == image_id
    assert list(saved.diff_ids) == diff_ids
    check_against(saved, image_id=image_id, diff_ids=diff_ids, what="the engine")


def test_the_layout_is_named():
    assert inspect(docker_layout()[0]).layout == "docker"
    assert inspect(oci_layout()[0]).layout == "oci"
    assert inspect(docker_layout(tag="demo-llm:1.3.1")[0]).repo_tags == ("demo-llm:1.3.1",)


def test_a_duplicate_layer_saved_as_a_symlink_is_followed():
    layers = [DEFAULT_LAYERS[0], DEFAULT_LAYERS[1], DEFAULT_LAYERS[0]]
    data, image_id, diff_ids = docker_layout(layers, duplicate_as_link=True)
    assert list(inspect(data).diff_ids) == diff_ids


def flip(data: bytes, needle: bytes) -> bytes:
    at = data.index(needle)
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def test_a_flipped_byte_in_a_layer_is_named():
    data, _, _ = docker_layout()
    with pytest.raises(ArchiveError, match=r"layer 2 \(.*/layer\.tar\) has diffID sha256:[0-9a-f]+, but the "
                                           r"image config says sha256:"):
        inspect(flip(data, b'{"a": 1}'))


def test_a_flipped_byte_in_an_oci_blob_breaks_its_content_address():
    data, _, _ = oci_layout()
    with pytest.raises(ArchiveError, match=r"blob blobs/sha256/[0-9a-f]{64} does not match its content address"):
        inspect(flip(data, b'{"a": 1}'))


def test_a_tampered_config_is_refused():
    data, _, _ = docker_layout()
    with pytest.raises(ArchiveError, match=r"config [0-9a-f]{64}\.json does not match its content address"):
        inspect(data.replace(b'"PATH=/bin"', b'"PATH=/xyz"'))


def test_an_archive_that_differs_from_the_engine_is_refused():
    data, image_id, diff_ids = docker_layout()
    saved = inspect(data)
    with pytest.raises(ArchiveError, match=r"differs from the image ID sha256:0+ that the manifest records"):
        check_against(saved, image_id="sha256:" + "0" * 64, diff_ids=diff_ids, what="the manifest")
    with pytest.raises(ArchiveError, match=r"layer 3: the archive's diffID .* differs from sha256:1+ in the manifest"):
        check_against(saved, image_id=image_id, diff_ids=diff_ids[:2] + ["sha256:" + "1" * 64], what="the manifest")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_a_truncated_archive_is_reported_as_truncated(keep):
    data, _, _ = docker_layout()
    end = data.index(b'{"demo": {"1": "x"}}')  # the last member's content
    with pytest.raises(ArchiveError, match=r"truncated"):
        inspect(data[:int(end * keep)] if keep < 0.9 else data[:end + 5])


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../escape"])
def test_members_that_leave_the_archive_are_refused(name):
    data = _archive([(name, b"x", None)])
    with pytest.raises(ArchiveError, match=r"absolute or unsafe path|points outside the archive"):
        inspect(data)


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside"])
def test_links_that_escape_are_refused(target):
    data = _archive([("abc/layer.tar", None, target)])
    with pytest.raises(ArchiveError, match=r"absolute path|points outside the archive"):
        inspect(data)


def test_not_an_image_archive():
    with pytest.raises(ArchiveError, match=r"neither manifest\.json nor index\.json"):
        inspect(_archive([("hello.txt", b"hi", None)]))
    with pytest.raises(ArchiveError, match=r"not a valid tar stream"):
        inspect(b"this is not a tar file at all" * 40)


def test_a_layer_missing_from_the_archive_is_named():
    layers = DEFAULT_LAYERS
    data, _, _ = docker_layout(layers)
    entries = [(m, d, None) for m, d in _members(data) if not m.endswith("/layer.tar") or d != layers[1]]
    with pytest.raises(ArchiveError, match=r"the archive has no '[0-9a-f]{64}/layer\.tar', which its manifest names"):
        inspect(_archive(entries))


def test_a_damaged_member_header_is_not_taken_for_the_end():
    data, _, _ = docker_layout()
    at = data.index(b"/layer.tar")  # inside the first member's header: its checksum no longer matches
    with pytest.raises(ArchiveError, match=r"damaged member header"):
        inspect(data[:at] + b"X" + data[at + 1:])


def _members(data: bytes):
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


def test_a_big_layer_is_hashed_not_kept():
    big = layer_tar({"weights.bin": bytes(range(256)) * (80 * 1024)})  # 20 MiB, above the keep limit
    data, image_id, diff_ids = docker_layout([big])
    saved = inspect(data)
    assert list(saved.diff_ids) == diff_ids
    assert saved.layer_members[0].size == len(big) and saved.layer_members[0].data is None  # hashed, not held
