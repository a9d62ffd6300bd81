"""Stage 4: normalise the built image so that identical inputs give an identical image ID.

The engine stamps build times everywhere: in the folders a COPY creates, on files a builder stage
compiles, in the config's ``created`` and history, and the build container's ID in the config.
This stage rewrites the image in one stream (save -> rewrite -> load, nothing held in memory):

* in every layer unibake adds (those under the install root), every time is set to
  ``SOURCE_DATE_EPOCH`` and owner names are emptied (numeric owners stay). Clamping alone (only
  later times lowered) is not enough: a layer reused from the build cache keeps the time it was
  first built at, so a warm and a cold build would differ;
* the base image's layers pass through untouched (and are not sent back to the engine: it has them);
* the config gets ``created`` and every history time set to the epoch, loses the fields that name
  the build container (``container``, ``container_config``, ``docker_version``, ``config.Image``),
  and records the epoch in the label ``io.unibake.source-date-epoch``; it is written with sorted
  keys, so its digest (the image ID) is stable.

The tag then names the normalised image; the image the engine built stays as build cache.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .archive import ChunkReader, tar_header, tar_padding
from .builder import BuiltImage, iso_time
from .engine import Engine
from .errors import EngineError, VerificationError
from .layertar import LayerFormatError, LayerRewrite
from .savestream import CHUNK, ArchiveError, _safe_name

EPOCH_LABEL = "io.unibake.source-date-epoch"
VERSION = 1  # of the rewrite: a change to it must not reuse images normalised before
META_LIMIT = 16 << 20
DROPPED_CONFIG_KEYS = ("container", "container_config", "docker_version")


def normalised_config(raw: bytes, diff_ids: list[str], epoch: int) -> bytes:
    """The image config with build-time traces removed; sorted keys, so its digest is stable."""
    config = json.loads(raw)
    stamp = iso_time(epoch)
    config["created"] = stamp
    for entry in config.get("history") or []:
        entry["created"] = stamp
    for key in DROPPED_CONFIG_KEYS:
        config.pop(key, None)
    inner = config.setdefault("config", {})
    inner.pop("Image", None)
    inner["Labels"] = {**(inner.get("Labels") or {}), EPOCH_LABEL: str(epoch)}
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class _Rewrite:
    epoch: int
    owned: str
    tag: str
    base_diff_ids: tuple[str, ...]
    new_digests: dict[str, str] = field(default_factory=dict)  # member -> sha256 of the rewritten layer
    untouched: dict[str, str] = field(default_factory=dict)  # member -> sha256, layers passed through
    links: dict[str, str] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)
    out_names: dict[str, str] = field(default_factory=dict)
    layer_names: list[str] = field(default_factory=list)
    config: bytes = b""
    diff_ids: list[str] = field(default_factory=list)


def _is_layer(name: str, first: bytes) -> bool:
    if name.endswith("/layer.tar"):
        return True
    if name.startswith("blobs/sha256/") and len(first) == tarfile.BLOCKSIZE:
        try:
            tarfile.TarInfo.frombuf(first, "utf-8", "surrogateescape")
            return True
        except tarfile.HeaderError:
            return False
    return False


def _stream(chunks, state: _Rewrite) -> Iterator[bytes]:
    """The normalised image as a ``docker load`` stream (classic layout), built as the save is read."""
    reader = ChunkReader(chunks)
    try:
        with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK) as tar:
            for info in tar:
                name = _safe_name(info.name)
                if info.isdir() or not name:
                    continue
                if info.issym() or info.islnk():
                    target = info.linkname if info.islnk() else posixpath.join(posixpath.dirname(name), info.linkname)
                    state.links[name] = _safe_name(target)
                    continue
                stream = tar.extractfile(info)
                first = stream.read(min(tarfile.BLOCKSIZE, info.size))
                if not _is_layer(name, first):
                    if info.size > META_LIMIT:
                        raise ArchiveError(f"{name} in the save stream is neither a layer nor metadata")
                    state.kept[name] = first + stream.read()
                    continue
                rewrite = LayerRewrite(_Prefixed(first, stream), info.size, epoch=state.epoch, owned=state.owned)
                pieces = iter(rewrite)
                head = next(pieces, b"")
                digest = hashlib.sha256(head)
                if rewrite.ours:
                    out = name if name.endswith("/layer.tar") else f"layers/{posixpath.basename(name)}.tar"
                    state.out_names[name] = out
                    yield tar_header(out, info.size) + head
                    for piece in pieces:
                        digest.update(piece)
                        yield piece
                    yield tar_padding(info.size)
                    state.new_digests[name] = digest.hexdigest()
                else:  # the base image's: the engine has it; hash it only to check that
                    for piece in pieces:
                        digest.update(piece)
                    state.untouched[name] = digest.hexdigest()
    except (LayerFormatError, tarfile.TarError) as exc:
        raise ArchiveError(f"cannot normalise the image's save stream: {exc}") from None
    _finish(state)
    config_name = f"{hashlib.sha256(state.config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [state.tag],
                            "Layers": [state.out_names.get(n, n) for n in state.layer_names]}]).encode()
    for name, data in ((config_name, state.config), ("manifest.json", manifest)):
        yield tar_header(name, len(data)) + data + tar_padding(len(data))
    yield bytes(2 * tarfile.BLOCKSIZE)


class _Prefixed:
    """A stream with the bytes already read from it put back in front."""

    def __init__(self, first: bytes, stream):
        self._first, self._stream = first, stream

    def read(self, size: int = -1) -> bytes:
        if self._first:
            n = len(self._first) if size < 0 else min(size, len(self._first))
            data, self._first = self._first[:n], self._first[n:]
            return data
        return self._stream.read(size)


def _resolve(state: _Rewrite, name: str) -> str:
    seen = set()
    while name in state.links:
        if name in seen:
            raise ArchiveError(f"link loop at {name} in the save stream")
        seen.add(name)
        name = state.links[name]
    return name


def _finish(state: _Rewrite) -> None:
    """Work out the new diffIDs and config once every layer has passed."""
    def kept_json(name: str):
        data = state.kept.get(_resolve(state, name))
        if data is None:
            raise ArchiveError(f"the save stream has no {name}")
        return json.loads(data)

    if "manifest.json" in state.kept:
        entry = kept_json("manifest.json")[0]
        config_name, layers = entry["Config"], list(entry["Layers"])
    else:
        index = kept_json("index.json")
        digest = index["manifests"][0]["digest"].split(":", 1)[1]
        oci = kept_json(f"blobs/sha256/{digest}")
        config_name = "blobs/sha256/" + oci["config"]["digest"].split(":", 1)[1]
        layers = ["blobs/sha256/" + layer["digest"].split(":", 1)[1] for layer in oci["layers"]]
    raw_config = state.kept[_resolve(state, config_name)]
    raw_diff_ids = json.loads(raw_config)["rootfs"]["diff_ids"]
    state.layer_names = layers
    diff_ids = []
    for i, name in enumerate(layers):
        real = _resolve(state, name)
        if real in state.new_digests:
            diff_ids.append(f"sha256:{state.new_digests[real]}")
            if real != name:  # a duplicate layer saved as a link: the engine needs the file
                state.out_names[name] = state.out_names[real]
            continue
        digest = f"sha256:{state.untouched.get(real, '')}"
        if digest != raw_diff_ids[i]:
            raise ArchiveError(f"layer {i + 1} ({name}) does not match the image's diffID {raw_diff_ids[i]}")
        if i >= len(state.base_diff_ids) or state.base_diff_ids[i] != digest:
            raise VerificationError(f"layer {i + 1} ({digest}) lies outside {state.owned} but is not a layer of "
                                    "the base image; normalise only knows the layers unibake adds")
        diff_ids.append(digest)
    state.diff_ids = diff_ids
    state.config = normalised_config(raw_config, diff_ids, state.epoch)


def normalise_image(engine: Engine, built: BuiltImage, *, epoch: int, base_image: str, owned: str,
                    cache: Path | None = None, reuse: bool = True) -> BuiltImage:
    """Rewrite ``built`` as described above and point its tag at the result.

    ``cache``: a folder remembering which normalised image each built image gave, so that a build
    the engine took wholly from its cache is not rewritten again (kept outside the image: recording
    the built image's ID inside it would make the normalised ID depend on build times again).
    ``reuse=False`` (a cold build) still records, but does not look.
    """
    memo = cache / f"v{VERSION}-{built.image_id.removeprefix('sha256:')}-{epoch}" if cache else None
    if reuse and memo is not None and memo.is_file():
        known = engine.inspect_image(memo.read_text().strip())
        if known is not None:
            engine.tag(known.id, built.tag)
            return BuiltImage(image_id=known.id, tag=built.tag, diff_ids=known.diff_ids, labels=known.labels,
                              size=known.size, steps=built.steps, seconds=built.seconds)
    base = engine.inspect_image(base_image)
    if base is None:
        raise EngineError(f"the base image {base_image} is gone from the engine")
    state = _Rewrite(epoch=epoch, owned=owned, tag=built.tag, base_diff_ids=base.diff_ids)
    stream = _stream(engine.save(built.tag), state)
    try:
        engine.load(stream)
    finally:
        stream.close()
    image_id = f"sha256:{hashlib.sha256(state.config).hexdigest()}"
    info = engine.inspect_image(built.tag)
    if info is None or info.id != image_id or list(info.diff_ids) != state.diff_ids:
        raise VerificationError(f"after normalising, {built.tag} is {info.id if info else 'missing'}, not the "
                                f"{image_id} the rewritten config describes")
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(image_id + "\n")
    return BuiltImage(image_id=info.id, tag=built.tag, diff_ids=info.diff_ids, labels=info.labels, size=info.size,
                      steps=built.steps, seconds=built.seconds)
