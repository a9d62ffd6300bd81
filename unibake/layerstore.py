"""An image read from the engine's own storage instead of through its ``docker save``, where this process can.

Engine 20.10's save (``GET /images/NAME/get``) first copies every layer into a temporary folder and only
then streams that folder: on the benchmark's 2.5 GB image its first byte comes after 12-17 s of a 14-20 s
export, one core idle meanwhile, and no API hands on a layer's bytes sooner (docs/BENCHMARKS.md). The
engine keeps each layer as its files (overlay2's ``diff`` folder) and a tar-split record of the tar they
came in (``tar-split.json.gz``: the tar's headers and padding as raw segments, every file by its name and
size), and its save writes the one into the other (vbatts/tar-split's ``asm.WriteOutputTarStream``). This
module does the same, from the first byte, and hands on a stream shaped as a ``docker save`` (the classic
layout: the config, each layer, ``manifest.json``) that the archive writer reads as it reads the engine's.

Nothing here is taken on trust. The config read must hash to the image ID the engine reports, each layer's
record must name the layer by its diffID and the chain of the diffIDs below it, and the archive writer
hashes every layer's bytes as it does a save stream's and holds them to the config's diffIDs. Any
difference, a file missing, changed or of another size, and the archive is written from the engine's save
instead (:func:`archive_image`, with a warning that says why). Bytes that hash to the config's diffIDs are
the image's layers, wherever they were read.

Only where it can be read: an engine whose storage driver is overlay2 (the default of Engine 20.10 and
later), whose data root this process can read (root, as CI runs), and that holds the image there. An
engine on the containerd image store keeps no such folder; an engine reached over the network (tcp://,
ssh://) is read through its save (a socket forwarded from another host names a folder that may be another
engine's: what it holds is read only if it hashes to this image's digests, as above). ``--engine-save``
always reads the save.

Hand-written: no library reads the engine's layer store (it is the engine's private format, read by moby's
Go code only); the format is small and every byte it yields is checked against the image's digests.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import ArchiveError, StoreMismatch
from .files import read_small_file
from .imagetar import BLOCK, KEEP_LIMIT, tar_header, tar_padding

DRIVER = "overlay2"
PIECE = 256 << 10  # what the stream hands on at a time: docker_engine.SAVE_PIECE, the save stream's own
LINE_LIMIT = 1 << 20  # a tar-split line: a header's segment (a long name's PAX record too), or a file's entry
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SEGMENT, _FILE = 2, 1  # tar-split's entry types (storage.SegmentType, storage.FileType)
FROM_STORE = "read from the engine's storage"  # how archive_image's on_source message begins when it read the store


@dataclass(frozen=True, kw_only=True)
class StoredLayer:
    diff_id: str
    chain: str  # the hex of its chain ID: the layer store's name for it
    split: Path  # its tar-split record
    files: Path  # its files (overlay2's diff folder)


@dataclass(frozen=True, kw_only=True)
class StoredImage:
    """An image found in the engine's storage, its config checked against its ID."""

    root: Path
    image_id: str
    config: bytes
    layers: tuple[StoredLayer, ...]

    def stream(self, repo_tags: tuple[str, ...] = ()) -> Iterator[bytes]:
        """The image as a ``docker save`` stream (classic layout), in pieces of about :data:`PIECE`."""
        yield self._config_member()
        for layer in self.layers:
            size = _tar_size(layer)
            yield tar_header(_layer_name(layer), size)
            yield from _layer_bytes(layer, size)
            yield tar_padding(size)
        yield self._manifest_member(repo_tags)

    def config_archive(self) -> bytes:
        """The image as a ``docker save`` archive of its config alone: its manifest names every layer and it
        carries none of their files. An engine that holds the layers already (by their chain IDs) loads it as the
        image: Engine 20.10's load looks each layer up by its chain ID first and opens its file only when it lacks
        the layer (so one that lacks a layer refuses the archive)."""
        return self._config_member() + self._manifest_member(())

    def _config_member(self) -> bytes:
        return tar_header(self._config_name(), len(self.config)) + self.config + tar_padding(len(self.config))

    def _config_name(self) -> str:
        return f"{self.image_id.removeprefix('sha256:')}.json"

    def _manifest_member(self, repo_tags: tuple[str, ...]) -> bytes:
        manifest = json.dumps([{"Config": self._config_name(), "RepoTags": list(repo_tags),
                                "Layers": [_layer_name(layer) for layer in self.layers]}]).encode()
        return tar_header("manifest.json", len(manifest)) + manifest + tar_padding(len(manifest)) + bytes(2 * BLOCK)


def _layer_name(layer: StoredLayer) -> str:
    return f"{layer.chain}/layer.tar"


def chain_ids(diff_ids: tuple[str, ...] | list[str]) -> list[str]:
    """The chain ID of each layer (the OCI image spec's ChainID): the layer store's name for it."""
    chains: list[str] = []
    for diff_id in diff_ids:
        chains.append(diff_id if not chains else
                      "sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest())
    return chains


def find_image(root: str | Path, driver: str, image_id: str) -> StoredImage | str:
    """The image ``image_id`` in the engine's data root ``root``, or why it cannot be read from there. Its
    layers are the ones its config lists (the config hashed to the image ID first)."""
    if driver != DRIVER:
        return f"the engine stores its layers with {driver or 'an unnamed driver'}, not {DRIVER}"
    if not _DIGEST.fullmatch(image_id):
        return "the engine reports an image ID that is no sha256 digest"
    root = Path(root)
    images = root / "image" / DRIVER
    if not os.access(images, os.R_OK | os.X_OK):
        return f"this user cannot read the engine's storage ({images})"
    hex_id = image_id.removeprefix("sha256:")
    config = _small_file(images / "imagedb" / "content" / "sha256" / hex_id, KEEP_LIMIT)
    if config is None or hashlib.sha256(config).hexdigest() != hex_id:
        return f"the engine's storage ({root}) holds no config that hashes to {image_id}"
    try:  # (the archive writer reads the config again, as an engine does, and refuses what an engine would)
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    except (ValueError, KeyError, TypeError, RecursionError):
        diff_ids = None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in diff_ids):
        return f"the config of {image_id} lists no diffIDs as the engine's storage keeps them"
    layers = []
    for n, (diff_id, chain) in enumerate(zip(diff_ids, chain_ids(diff_ids)), 1):
        record = images / "layerdb" / "sha256" / chain.removeprefix("sha256:")
        named = _small_file(record / "diff", 1024)
        cache = _small_file(record / "cache-id", 1024)
        cache_id = cache.decode("ascii", "replace").strip() if cache is not None else ""
        if named is None or named.decode("ascii", "replace").strip() != diff_id or not _HEX64.fullmatch(cache_id):
            return f"the engine's storage ({root}) has no record of layer {n} ({diff_id}) under its chain ID"
        files = root / DRIVER / cache_id / "diff"
        split = record / "tar-split.json.gz"
        if not _is(split, stat.S_ISREG) or not _is(files, stat.S_ISDIR):
            return f"the engine's storage ({root}) lacks layer {n}'s files or its tar-split record"
        layers.append(StoredLayer(diff_id=diff_id, chain=chain.removeprefix("sha256:"), split=split, files=files))
    return StoredImage(root=root, image_id=image_id, config=config, layers=tuple(layers))


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def _small_file(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes, not through a link at its last step; None if it is not one, unreadable, or
    over ``limit``: the storage is then read through the save."""
    try:
        return read_small_file(path, StoreMismatch, limit=limit, follow=False)
    except (StoreMismatch, OSError):
        return None


def _entries(layer: StoredLayer) -> Iterator[tuple[int, bytes | str, int]]:
    """The layer's tar-split record: (type, segment bytes or file name, size), in order. Refuses what the
    engine never writes: an entry out of its place, a name that leaves the layer, a line past LINE_LIMIT."""
    what = f"layer {layer.diff_id}'s tar-split record"
    try:
        with gzip.open(layer.split, "rb") as fh:
            position = 0
            while True:
                line = fh.readline(LINE_LIMIT + 1)
                if not line:
                    return
                if len(line) > LINE_LIMIT:
                    raise StoreMismatch(f"{what} has a line over {LINE_LIMIT} bytes")
                entry = json.loads(line)
                if not isinstance(entry, dict) or entry.get("position") != position:
                    raise StoreMismatch(f"{what} has an entry out of its place ({position})")
                position += 1
                kind = entry.get("type")
                if kind == _SEGMENT:
                    payload = base64.b64decode(entry.get("payload") or "", validate=True)
                    yield _SEGMENT, payload, len(payload)
                elif kind == _FILE:
                    size = entry.get("size", 0)
                    if type(size) is not int or size < 0:
                        raise StoreMismatch(f"{what} gives a file a size that is no count of bytes")
                    if size:
                        raw = entry.get("name_raw")
                        yield _FILE, _name(base64.b64decode(raw, validate=True) if raw else entry.get("name"), what), \
                            size
                else:
                    raise StoreMismatch(f"{what} has an entry of unknown type {str(kind)[:20]!r}")
    except (OSError, EOFError, zlib.error, ValueError, TypeError) as exc:
        # (gzip's BadGzipFile is an OSError; json's and base64's errors are ValueErrors)
        raise StoreMismatch(f"{what} cannot be read: {exc}") from None


def _name(name: object, what: str) -> str:
    """A file's name in the layer, as a path under its files: never absolute, never through ``..``."""
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not isinstance(name, str) or not name or "\0" in name:
        raise StoreMismatch(f"{what} names a file by no name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise StoreMismatch(f"{what} names a file outside the layer ({name[:80]!r})")
    return "/".join(parts)


def _tar_size(layer: StoredLayer) -> int:
    """How many bytes the layer's tar holds: its segments and its files, by the record (a first pass over it;
    a second one streams the bytes: the headers of a layer of 50,000 files held in memory instead would be tens
    of MB, more than the stage's whole peak memory target allows to grow with image size)."""
    return sum(size for _, _, size in _entries(layer))


def layer_tar(layer: StoredLayer, on_size: Callable[[int], object] = lambda size: None) -> Iterator[bytes]:
    """The layer's tar as the engine's save gives it (``on_size`` told its length first, as a tar header
    needs it), or StoreMismatch."""
    size = _tar_size(layer)
    on_size(size)
    yield from _layer_bytes(layer, size)


def _layer_bytes(layer: StoredLayer, size: int) -> Iterator[bytes]:
    """The layer's tar, as the engine's save assembles it: each segment as it is, each file's bytes read
    (through no link at its last step: a file of a layer is one; at the steps before it the layer's own
    folders), in pieces of about PIECE; exactly ``size`` bytes, or StoreMismatch."""
    held = bytearray()
    given = 0
    files = os.fspath(layer.files)
    folders = {""}  # the layer's folders a file was found under: each step a folder, never a link
    for kind, value, length in _entries(layer):
        if kind == _SEGMENT:
            held += value
        else:
            _under_folders(files, value, folders, layer)
            path = os.path.join(files, value)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                raise StoreMismatch(f"layer {layer.diff_id}'s file {value[:120]!r} cannot be read: "
                                    f"{exc.strerror}") from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size != length:
                    raise StoreMismatch(f"layer {layer.diff_id}'s file {value[:120]!r} is not the regular file of "
                                        f"{length} bytes its tar-split record names")
                left = length
                while left:
                    direct = not held and left >= PIECE  # (a big file's pieces handed on as read, not copied)
                    piece = os.read(fd, PIECE if direct else min(left, PIECE - len(held)))
                    if not piece:
                        raise StoreMismatch(f"layer {layer.diff_id}'s file {value[:120]!r} ended early")
                    left -= len(piece)
                    if direct:
                        given += len(piece)
                        yield piece
                        continue
                    held += piece
                    if len(held) >= PIECE:
                        given += len(held)
                        yield bytes(held)
                        held.clear()
            except OSError as exc:
                raise StoreMismatch(f"layer {layer.diff_id}'s file {value[:120]!r} cannot be read: "
                                    f"{exc.strerror}") from None
            finally:
                os.close(fd)
        if len(held) >= PIECE:
            given += len(held)
            yield bytes(held)
            held.clear()
    given += len(held)
    if given != size:
        raise StoreMismatch(f"layer {layer.diff_id}'s tar-split record gave {given} bytes, not the {size} it "
                            "counted")
    if held:
        yield bytes(held)


def _under_folders(files: str, name: str, folders: set[str], layer: StoredLayer) -> None:
    """Every step above the file ``name`` is a folder of the layer, not a link (the engine's own save would
    follow one, to a file outside the layer, and fail on its checksum; here it is never opened). Each folder is
    looked at once (``folders``, the ones seen)."""
    parent = name.rpartition("/")[0]
    missing = []
    while parent not in folders:
        missing.append(parent)
        parent = parent.rpartition("/")[0]
    for folder in reversed(missing):
        try:
            kind = os.lstat(os.path.join(files, folder)).st_mode
        except OSError as exc:
            raise StoreMismatch(f"layer {layer.diff_id}'s folder {folder[:120]!r} cannot be read: {exc.strerror}") \
                from None
        if not stat.S_ISDIR(kind):
            raise StoreMismatch(f"layer {layer.diff_id}'s file {name[:120]!r} lies under {folder[:120]!r}, which is "
                                "not a folder of the layer (a link?)")
        folders.add(folder)


def stored_image(engine, image_id: str) -> StoredImage | str:
    """The image as the engine's storage holds it (:func:`find_image`), or why it is read through the save."""
    where = engine.storage()
    if isinstance(where, str):
        return where
    return find_image(where[0], where[1], image_id)


def archive_image(engine, ref: str, *, image_id: str, write: Callable,
                  use_store: bool = True, on_source: Callable[[str], object] = lambda message: None,
                  on_fallback: Callable[[str], object] = lambda message: None):
    """``write(chunks)`` (the archive writer, given a save stream) over the image ``ref``: from the engine's
    storage where it can be read, else from its save; ``on_source`` is told which, and why not the storage.
    A store whose bytes are not the image's (:class:`StoreMismatch`, or the writer's ArchiveError: a diffID
    or the config differs) is left for the save, ``on_fallback`` told why; the writer leaves nothing behind
    when it fails, so the second pass starts clean."""
    stored = stored_image(engine, image_id) if use_store else "--engine-save"
    if isinstance(stored, StoredImage):
        on_source(f"{FROM_STORE} ({stored.root}), every byte checked against the image's digests")
        try:
            return write(stored.stream((ref,) if not _DIGEST.fullmatch(ref) else ()))
        except (StoreMismatch, ArchiveError) as exc:
            on_fallback(f"the engine's storage did not give {ref}'s own bytes ({str(exc)[:300]}); the archive is "
                        "written from the engine's save instead")
    else:
        on_source(f"read through the engine's save ({stored})")
    return write(engine.save(ref))
