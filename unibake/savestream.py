"""Read a ``docker save`` tar stream in one pass and recompute what identifies the image.

Understands both layouts: Engine 20.10's (``manifest.json``, ``<id>.json`` config,
``<id>/layer.tar``) and the OCI layout of Engine 25+ (``oci-layout``, ``index.json``,
``blobs/sha256/<hex>``, plus a compatibility ``manifest.json``). Every member is hashed as it passes;
small metadata files are kept; nothing is extracted to disk and no layer is held in memory.

The result is the config digest (the image ID) and every layer's diffID (the sha256 of the
uncompressed layer tar), each recomputed from the bytes, and checked against the config's own
``rootfs.diff_ids`` and, in the OCI layout, against every blob's content address.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from .errors import VerificationError

CHUNK = 1 << 20
KEEP_LIMIT = 16 << 20  # metadata files (configs, manifests) are kept up to this size
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class ArchiveError(VerificationError):
    """The archive is not a well-formed image archive, or does not match what it claims."""


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str
    size: int
    sha256: str  # of the bytes as stored
    content_sha256: str  # of the uncompressed content (the diffID for a layer)
    data: bytes | None  # kept when small
    link: str | None = None  # for a symlink or hard link: the member it points at
    spool: object = None  # where the bytes went instead, when a spool was given


@dataclass(frozen=True, kw_only=True)
class SavedImage:
    """What the save stream says about the image, recomputed from its bytes."""

    layout: str  # "docker" or "oci"
    image_id: str  # sha256:<hex> of the config
    diff_ids: tuple[str, ...]
    repo_tags: tuple[str, ...]
    config: dict
    members: int
    config_bytes: bytes = b""
    layer_members: tuple[Member | None, ...] = ()  # each layer's member, links resolved; None if omitted


def _safe_name(name: str) -> str:
    if name.startswith("/") or "\\" in name:
        raise ArchiveError(f"archive member {name!r} has an absolute or unsafe path")
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        raise ArchiveError(f"archive member {name!r} points outside the archive")
    return "" if norm == "." else norm


def _hash_member(stream: BinaryIO, size: int, keep: bool, sink=None,
                 first_block: bytes = b"") -> tuple[str, str, bytes | None]:
    raw = hashlib.sha256()
    content = None  # a second hash only for compressed blobs
    decomp = None
    kept: list[bytes] | None = [] if keep else None
    remaining = size
    first = True
    while remaining > 0:
        if first_block:
            block, first_block = first_block, b""
        else:
            block = stream.read(min(CHUNK, remaining))
        if not block:
            raise ArchiveError(f"the archive ends in the middle of a member ({remaining} bytes missing): "
                               "truncated download?")
        remaining -= len(block)
        if first:
            first = False
            if block.startswith(GZIP_MAGIC):
                decomp, content = zlib.decompressobj(wbits=31), hashlib.sha256()
            elif block.startswith(ZSTD_MAGIC):
                decomp = zstandard.ZstdDecompressor(max_window_size=1 << 27).decompressobj()
                content = hashlib.sha256()
        raw.update(block)
        if sink is not None:
            sink.write(block)
        if decomp is not None:
            try:
                _inflate(decomp, block, content)
            except (zlib.error, zstandard.ZstdError):
                decomp, content = None, None  # not a compressed layer after all
        if kept is not None:
            kept.append(block)
    digest = raw.hexdigest()
    return digest, content.hexdigest() if content is not None else digest, b"".join(kept) if kept is not None else None


def _inflate(decomp, block: bytes, sink) -> None:
    """Decompress ``block`` into ``sink`` a bounded piece at a time (no decompression bomb in memory)."""
    if hasattr(decomp, "unconsumed_tail"):  # zlib
        data = decomp.decompress(block, CHUNK)
        sink.update(data)
        while decomp.unconsumed_tail:
            sink.update(decomp.decompress(decomp.unconsumed_tail, CHUNK))
    else:
        sink.update(decomp.decompress(block))


SPOOL_THRESHOLD = 64 << 10


def read_members(reader: BinaryIO, spool=None) -> dict[str, Member]:
    """Every member of a tar stream, hashed; refuses unsafe names and links that escape.

    Small members are kept. With ``spool`` (``spool(name, size)`` returning an object with
    ``write`` and ``close``), members over 64 KiB that are not JSON (the layers) are written there
    instead of being kept, and closed when complete.
    """
    members: dict[str, Member] = {}
    try:
        with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK) as tar:
            for info in tar:
                name = _safe_name(info.name)
                if info.isdir() or not name:
                    continue
                if info.issym() or info.islnk():
                    target = info.linkname if info.islnk() else posixpath.join(posixpath.dirname(name),
                                                                             info.linkname)
                    if info.linkname.startswith("/"):
                        raise ArchiveError(f"archive member {name!r} links to an absolute path {info.linkname!r}")
                    members[name] = Member(name=name, size=0, sha256="", content_sha256="", data=None,
                                           link=_safe_name(target))
                    continue
                if not info.isreg():
                    raise ArchiveError(f"archive member {name!r} is not a regular file, folder or link")
                stream = tar.extractfile(info)
                assert stream is not None
                first = stream.read(min(CHUNK, info.size))
                sink = None
                if spool is not None and info.size > SPOOL_THRESHOLD and first[:1] not in (b"{", b"["):
                    sink = spool(name, info.size)
                keep = sink is None and info.size <= KEEP_LIMIT
                raw, content, data = _hash_member(stream, info.size, keep, sink, first)
                if sink is not None:
                    sink.close()  # the member is complete: its frame can end
                members[name] = Member(name=name, size=info.size, sha256=raw, content_sha256=content, data=data,
                                       spool=sink)
            # tarfile stops quietly at a damaged or cut header; a real end is two zero blocks (and padding)
            rest = 0
            while True:
                block = tar.fileobj.read(CHUNK)
                if not block:
                    break
                rest += len(block)
                if block.strip(b"\0"):
                    raise ArchiveError(f"the archive has a damaged member header after {len(members)} members "
                                       "(or data past its end): corrupted archive")
            if rest < tarfile.BLOCKSIZE:
                raise ArchiveError("the archive ends early (no end-of-archive marker): truncated download?")
    except tarfile.ReadError as exc:
        if "unexpected end" in str(exc):
            raise ArchiveError("the archive ends early: truncated download?") from None
        raise ArchiveError(f"the archive is not a valid tar stream: {exc}") from None
    except (EOFError, tarfile.StreamError) as exc:
        raise ArchiveError(f"the archive ends early: truncated download? ({exc})") from None
    return members


def _resolve(members: dict[str, Member], name: str, seen: tuple[str, ...] = ()) -> Member:
    name = _safe_name(name)
    member = members.get(name)
    if member is None:
        raise ArchiveError(f"the archive has no {name!r}, which its manifest names")
    if member.link is not None:
        if name in seen:
            raise ArchiveError(f"archive member {name!r} is part of a link loop")
        return _resolve(members, member.link, seen + (name,))
    return member


def _json(members: dict[str, Member], name: str) -> object:
    member = _resolve(members, name)
    if member.data is None:
        raise ArchiveError(f"archive member {name!r} is too large for a metadata file ({member.size} bytes)")
    try:
        return json.loads(member.data)
    except ValueError as exc:
        raise ArchiveError(f"archive member {name!r} is not valid JSON: {exc}") from None


def _blob_name(digest: str) -> str:
    algo, _, hexdigest = str(digest).partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        raise ArchiveError(f"unsupported digest {digest!r} in the archive")
    return f"blobs/sha256/{hexdigest}"


def interpret(members: dict[str, Member], omitted: frozenset[str] = frozenset()) -> SavedImage:
    """The image the members describe; checks content addresses and the config's diffIDs.

    ``omitted``: diffIDs whose layers may be absent (a hotfix archive leaves out the layers the
    previous release shipped); their diffIDs are taken from the config, every other one recomputed.
    """
    layout = "oci" if "oci-layout" in members or "index.json" in members else "docker"
    if layout == "oci":
        for name, member in members.items():
            if name.startswith("blobs/sha256/") and member.link is None and member.sha256 != name.rsplit("/", 1)[1]:
                raise ArchiveError(f"blob {name} does not match its content address (its sha256 is "
                                   f"{member.sha256}): corrupted archive")
    if "manifest.json" in members:
        manifest = _json(members, "manifest.json")
        if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
            raise ArchiveError("manifest.json must describe exactly one image")
        entry = manifest[0]
        config_name, layer_names = entry.get("Config"), entry.get("Layers")
        repo_tags = tuple(entry.get("RepoTags") or ())
    elif layout == "oci":
        index = _json(members, "index.json")
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if not manifests or len(manifests) != 1:
            raise ArchiveError("index.json must name exactly one image manifest")
        oci_manifest = _json(members, _blob_name(manifests[0].get("digest")))
        config_name = _blob_name((oci_manifest.get("config") or {}).get("digest"))
        layer_names = [_blob_name(layer.get("digest")) for layer in oci_manifest.get("layers") or []]
        ref = (manifests[0].get("annotations") or {}).get("io.containerd.image.name")
        repo_tags = (ref,) if ref else ()
    else:
        raise ArchiveError("the archive has neither manifest.json nor index.json: not a docker save archive")
    if not isinstance(config_name, str) or not isinstance(layer_names, list):
        raise ArchiveError("the image manifest lacks its Config or Layers")
    config_member = _resolve(members, config_name)
    config = _json(members, config_name)
    image_id = f"sha256:{config_member.sha256}"
    stem = posixpath.basename(config_name).removesuffix(".json")
    if len(stem) == 64 and stem != config_member.sha256:
        raise ArchiveError(f"config {config_name} does not match its content address: corrupted archive")
    declared = tuple((config.get("rootfs") or {}).get("diff_ids") or ()) if isinstance(config, dict) else ()
    if len(declared) != len(layer_names):
        raise ArchiveError(f"the image config lists {len(declared)} layers, the manifest {len(layer_names)}")
    diff_ids, layer_members = [], []
    for i, name in enumerate(layer_names):
        if _safe_name(name) not in members and declared[i] in omitted:
            diff_ids.append(declared[i])
            layer_members.append(None)
            continue
        member = _resolve(members, name)
        got = f"sha256:{member.content_sha256}"
        if got != declared[i]:
            raise ArchiveError(f"layer {i + 1} ({name}) has diffID {got}, but the image config says "
                               f"{declared[i]}: corrupted archive")
        diff_ids.append(got)
        layer_members.append(member)
    return SavedImage(layout=layout, image_id=image_id, diff_ids=tuple(diff_ids), repo_tags=repo_tags,
                      config=config, members=len(members), config_bytes=config_member.data or b"",
                      layer_members=tuple(layer_members))


def inspect_save_stream(reader: BinaryIO, omitted: frozenset[str] = frozenset()) -> SavedImage:
    """Read a whole ``docker save`` stream from ``reader`` and recompute the image's identity."""
    return interpret(read_members(reader), omitted)


def check_against(saved: SavedImage, *, image_id: str, diff_ids: tuple[str, ...] | list[str], what: str) -> None:
    """Refuse an archive whose recomputed identity differs from what ``what`` recorded."""
    if saved.image_id != image_id:
        raise ArchiveError(f"the archive's config digest {saved.image_id} differs from the image ID {image_id} "
                           f"that {what} records")
    if tuple(saved.diff_ids) != tuple(diff_ids):
        for i, (want, got) in enumerate(zip(diff_ids, saved.diff_ids)):
            if want != got:
                raise ArchiveError(f"layer {i + 1}: the archive's diffID {got} differs from {want} in {what}")
        raise ArchiveError(f"the archive holds {len(saved.diff_ids)} layers; {what} records {len(diff_ids)}")
