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
import threading
import zlib
from dataclasses import dataclass, field
from queue import Queue

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
HEAD = tarfile.BLOCKSIZE  # bytes of a member looked at before deciding where it goes


class Hasher:
    """sha256 updates in a second thread, in order: hashlib lets go of the GIL, so the hashing runs
    beside the reading and the compression instead of after them."""

    def __init__(self) -> None:
        self._queue: Queue = Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            item[0].update(item[1])

    def update(self, hasher, data) -> None:
        self._queue.put((hasher, data))

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()


@dataclass
class _Open:
    """A member being read."""

    name: str
    size: int
    remaining: int
    raw: object = field(default_factory=hashlib.sha256)
    content: object = None  # a second hash, of the uncompressed content, for compressed blobs
    decomp: object = None
    kept: list | None = None
    sink: object = None
    head: bytearray = field(default_factory=bytearray)
    started: bool = False


def _pax_records(data: bytes) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            raise ArchiveError("the archive has a malformed PAX header: corrupted archive")
        length = int(data[pos:space])
        record = data[space + 1:pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError("the archive has a malformed PAX header: corrupted archive")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def read_members(source, spool=None) -> dict[str, Member]:
    """Every member of a tar stream, hashed; refuses unsafe names and links that escape.

    ``source`` is an iterable of chunks (or a file with ``read``). Small members are kept. With
    ``spool`` (``spool(name, size)`` returning an object with ``write`` and ``close``), members over
    64 KiB that are not JSON (the layers) are written there instead, and closed when complete.
    The stream is walked block by block over the chunks as they come, without copying them
    (Python's tarfile copies every byte three times on the way); the hashing runs in a thread.
    """
    chunks = iter(lambda: source.read(CHUNK), b"") if hasattr(source, "read") else source
    hasher = Hasher()
    done: list[_Open] = []
    links: dict[str, str] = {}
    header = bytearray()
    meta: bytearray | None = None
    meta_kind = b""
    meta_size = 0
    pax: dict[str, str] = {}
    long_names: dict[bytes, str] = {}
    current: _Open | None = None
    skip = 0  # padding still to pass over
    zeros = 0  # zero blocks seen at the end
    headers = 0
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            pos, end = 0, len(view)
            while pos < end:
                if skip:
                    n = min(skip, end - pos)
                    skip -= n
                    pos += n
                elif zeros:  # past the end-of-archive block: nothing but zeros may follow
                    if bytes(view[pos:end]).strip(b"\0"):
                        raise ArchiveError(f"the archive has a damaged member header after {len(done)} members "
                                           "(or data past its end): corrupted archive")
                    zeros += (end - pos + tarfile.BLOCKSIZE - 1) // tarfile.BLOCKSIZE
                    pos = end
                elif current is not None:
                    n = min(current.remaining, end - pos)
                    _deliver(current, view[pos:pos + n], hasher, spool)
                    current.remaining -= n
                    pos += n
                    if current.remaining == 0:
                        _close(current, hasher, spool)
                        done.append(current)
                        skip = -current.size % tarfile.BLOCKSIZE
                        current = None
                elif meta is not None:
                    n = min(meta_size - len(meta), end - pos)
                    meta += view[pos:pos + n]
                    pos += n
                    if len(meta) == meta_size:
                        if meta_kind == tarfile.XHDTYPE:
                            pax = _pax_records(bytes(meta))
                        elif meta_kind in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                            long_names[meta_kind] = bytes(meta).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                        skip = -meta_size % tarfile.BLOCKSIZE
                        meta = None
                else:
                    n = min(tarfile.BLOCKSIZE - len(header), end - pos)
                    header += view[pos:pos + n]
                    pos += n
                    if len(header) < tarfile.BLOCKSIZE:
                        continue
                    block, header = bytes(header), bytearray()
                    if not block.strip(b"\0"):
                        zeros = 1
                        continue
                    try:
                        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                    except tarfile.HeaderError:
                        if not headers:
                            raise ArchiveError("the archive is not a valid tar stream: its first block is not a "
                                               "tar header") from None
                        raise ArchiveError(f"the archive has a damaged member header after {headers} headers: "
                                           "corrupted archive") from None
                    headers += 1
                    size = int(pax["size"]) if "size" in pax and info.type != tarfile.XHDTYPE else info.size
                    if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                                     tarfile.GNUTYPE_LONGLINK):
                        if size > KEEP_LIMIT:
                            raise ArchiveError("the archive has an oversized metadata header: corrupted archive")
                        meta, meta_kind, meta_size = bytearray(), info.type, size
                        if size == 0:
                            meta = None
                        continue
                    raw_name = long_names.pop(tarfile.GNUTYPE_LONGNAME, None) or pax.get("path") or info.name
                    linkname = long_names.pop(tarfile.GNUTYPE_LONGLINK, None) or pax.get("linkpath") or info.linkname
                    pax = {}
                    name = _safe_name(raw_name)
                    if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                        if linkname.startswith("/"):
                            raise ArchiveError(f"archive member {name!r} links to an absolute path {linkname!r}")
                        target = linkname if info.type == tarfile.LNKTYPE else posixpath.join(posixpath.dirname(name),
                                                                                              linkname)
                        links[name] = _safe_name(target)
                        continue
                    if info.type == tarfile.DIRTYPE or not name:
                        skip = size + (-size % tarfile.BLOCKSIZE) if info.type != tarfile.DIRTYPE else 0
                        continue
                    if info.type not in tarfile.REGULAR_TYPES or info.type == tarfile.GNUTYPE_SPARSE:
                        raise ArchiveError(f"archive member {name!r} is not a regular file, folder or link")
                    current = _Open(name=name, size=size, remaining=size)
                    if size == 0:
                        _close(current, hasher, spool)
                        done.append(current)
                        current = None
        if current is not None or meta is not None:
            missing = current.remaining if current is not None else meta_size - len(meta)
            raise ArchiveError(f"the archive ends in the middle of a member ({missing} bytes missing): "
                               "truncated download?")
        if header or not zeros:
            raise ArchiveError("the archive ends early (no end-of-archive marker): truncated download?")
    finally:
        hasher.finish()
        for m in done + ([current] if current is not None else []):
            if m.sink is not None and m is current:
                m.sink.close()
    members: dict[str, Member] = {}
    for m in done:
        raw = m.raw.hexdigest()
        members[m.name] = Member(name=m.name, size=m.size, sha256=raw,
                                 content_sha256=m.content.hexdigest() if m.content is not None else raw,
                                 data=b"".join(m.kept) if m.kept is not None else None, spool=m.sink)
    for name, target in links.items():
        members[name] = Member(name=name, size=0, sha256="", content_sha256="", data=None, link=target)
    return members


def _deliver(m: _Open, piece: memoryview, hasher: Hasher, spool) -> None:
    """Hand a piece of a member on; the first bytes decide where it goes (kept, spooled; compressed?)."""
    if not m.started:
        m.head += piece
        if len(m.head) < min(HEAD, m.size):
            return
        m.started = True
        first = bytes(m.head)
        piece = memoryview(first)
        if spool is not None and m.size > SPOOL_THRESHOLD and first[:1] not in (b"{", b"["):
            m.sink = spool(m.name, m.size)
        elif m.size <= KEEP_LIMIT:
            m.kept = []
        if first.startswith(GZIP_MAGIC):
            m.decomp, m.content = zlib.decompressobj(wbits=31), hashlib.sha256()
        elif first.startswith(ZSTD_MAGIC):
            m.decomp = zstandard.ZstdDecompressor(max_window_size=1 << 27).decompressobj()
            m.content = hashlib.sha256()
    hasher.update(m.raw, piece)
    if m.sink is not None:
        m.sink.write(piece)
    if m.kept is not None:
        m.kept.append(bytes(piece))
    if m.decomp is not None:
        try:
            _inflate(m.decomp, piece, m.content)
        except (zlib.error, zstandard.ZstdError):
            m.decomp = m.content = None  # not a compressed layer after all


def _close(m: _Open, hasher: Hasher, spool) -> None:
    if not m.started:  # shorter than the bytes looked at first
        m.started, head = True, bytes(m.head)
        m.kept = [head]
        hasher.update(m.raw, head)
    if m.sink is not None:
        m.sink.close()  # the member is complete: its frame can end


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


def inspect_save_stream(source, omitted: frozenset[str] = frozenset()) -> SavedImage:
    """Read a whole ``docker save`` stream (chunks, or a file) and recompute the image's identity."""
    return interpret(read_members(source), omitted)


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
