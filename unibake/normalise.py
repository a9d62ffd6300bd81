"""Normalise the built image so that identical inputs give an identical image ID.

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
  records the epoch in the label ``io.unibake.source-date-epoch`` and the target platform in
  ``os``/``architecture``/``variant`` (Engine 20.10's classic builder copies them from the base
  and ignores the build's platform); it is written with sorted keys, so its digest (the image ID)
  is stable.

The tag then names the normalised image; the image the engine built is kept as build cache.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .builder import BuiltImage, Image, image_platform, iso_time
from .engine import Engine
from .errors import ArchiveError, EngineError, InputError, LayerFormatError, UnibakeError, VerificationError
from .files import evict_oldest, linked_above, read_small_text, touch, write_atomic
from .imagetar import (BLOCK, LayerRewriter, Member, locate, looks_like_layer, read_members, resolve, tar_header,
                       tar_padding)
from .platforms import Platform, apply as apply_platform
from .schema import IMAGE_ID_RE
from .threads import Consumer, consume_in_thread, counted, hashing_thread, read_ahead

EPOCH_LABEL = "io.unibake.source-date-epoch"
VERSION = 2  # of the rewrite: a change to it must not reuse images normalised before
MEMOS_KEPT = 64  # memos of which image each build was normalised to: the newest (a memo used is made the newest)
DROPPED_CONFIG_KEYS = ("container", "container_config", "docker_version")


def normalised_config(raw: bytes, diff_ids: list[str], epoch: int, platform: Platform | None = None) -> bytes:
    """The image config with build-time traces removed and ``platform`` recorded; sorted keys, so its
    digest is stable."""
    config = json.loads(raw)
    if platform is not None:
        apply_platform(config, platform)
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


@dataclass(frozen=True, kw_only=True)
class RewrittenLayer:
    """A layer of ours as it went to the engine: its name in the load stream, and the sha256 of what
    was sent (final once the hashing thread has been closed)."""

    out_name: str
    sha256: object


class _LayerOut:
    """The sink of one layer member: rewritten into the load stream when it is ours, dropped otherwise."""

    def __init__(self, name: str, size: int, *, epoch: int, owned: str, put: Callable, hasher: Consumer):
        self.name, self.size, self.put, self.hasher = name, size, put, hasher
        self.out_name = name if name.endswith("/layer.tar") else f"layers/{posixpath.basename(name)}.tar"
        self.digest = hashlib.sha256()
        self.sent = 0
        self.rewriter = LayerRewriter(epoch=epoch, owned=owned, emit=self._emit)

    def _emit(self, data) -> None:
        if not self.sent:
            self.put(tar_header(self.out_name, self.size))
        self.sent += len(data)
        self.hasher.put((self.digest, data))
        self.put(data)

    def write(self, piece: memoryview) -> None:
        self.rewriter.write(piece)

    def close(self) -> RewrittenLayer | None:
        self.rewriter.close()
        if not self.rewriter.ours:
            return None
        if self.sent != self.size:
            raise LayerFormatError(f"layer {self.name} was rewritten to {self.sent} bytes, not {self.size}")
        self.put(tar_padding(self.size))
        return RewrittenLayer(out_name=self.out_name, sha256=self.digest)


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """What the rewrite of one save stream established."""

    config: bytes
    diff_ids: tuple[str, ...]
    save_bytes: int

    @property
    def image_id(self) -> str:
        return f"sha256:{hashlib.sha256(self.config).hexdigest()}"


def rewrite_into(engine_load: Callable, save: Callable[[], object], *, tag: str, epoch: int, owned: str,
                 base_diff_ids: tuple[str, ...], progress: Callable[[int], object] = lambda n: None,
                 platform: Platform | None = None) -> Rewrite:
    """Read ``save()`` once and feed ``engine_load`` (in its own thread) the normalised image:
    the rewritten layers of ours, then the new config and a manifest naming every layer."""
    saved_bytes = 0

    def advance(n: int) -> None:
        nonlocal saved_bytes
        saved_bytes += n
        progress(n)

    with consume_in_thread(engine_load, name="load") as loader, hashing_thread() as hasher:
        def route(name: str, size: int, head: bytes):
            if not looks_like_layer(name, head):
                return None
            return _LayerOut(name, size, epoch=epoch, owned=owned, put=loader.put, hasher=hasher)

        try:
            members = read_members(counted(read_ahead(save(), name="save"), advance), route=route)
        except LayerFormatError as exc:
            raise ArchiveError(f"cannot normalise the image's save stream: {exc}") from None
        hasher.close()
        rewrite, layer_names = _finish(members, epoch, base_diff_ids, owned, platform)
        end_of_load(loader, rewrite.config, tag, layer_names)
        loader.close()
    return Rewrite(config=rewrite.config, diff_ids=rewrite.diff_ids, save_bytes=saved_bytes)


def refuse_a_rewritten_base_layer(index: int, raw: str, rewritten: str, base_diff_ids: tuple[str, ...],
                                  owned: str) -> None:
    """A layer of the base image that starts under ``owned`` is taken for one of ours and rewritten
    (its times and owners): the base's layers would no longer be the image's first, and the release
    would fail later as if the base had changed since the build. Said here, naming the cause. (A
    rewrite that changed nothing is harmless.)"""
    if index < len(base_diff_ids) and rewritten != raw:
        raise InputError(f"layer {index + 1} of the base image ({base_diff_ids[index][:19]}...) starts under {owned}, "
                         f"the folder unibake owns: its files would be rewritten like the release's own; build on a "
                         f"base without {owned}")


def walk_layers(members: dict[str, Member], base_diff_ids: tuple[str, ...], owned: str,
                rewritten: Callable[[int, str, Member], str | None]) -> tuple[bytes, list[tuple[str, Member, str]]]:
    """A passed save stream's config and every layer in order, with its diffID once normalised:
    ``rewritten(index, name, member)`` gives a rewritten layer's new diffID, None for a layer that
    passed unchanged, which must then be the base image's own at that place."""
    where = locate(members)
    config_member = resolve(members, where.config_name)
    try:
        raw_diff_ids = json.loads(config_member.data or b"")["rootfs"]["diff_ids"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ArchiveError(f"the save stream's config {where.config_name} has no rootfs.diff_ids") from None
    walked: list[tuple[str, Member, str]] = []
    for i, name in enumerate(where.layer_names):
        member = resolve(members, name)
        digest = f"sha256:{member.content_sha256}"
        if i >= len(raw_diff_ids) or digest != raw_diff_ids[i]:
            raise ArchiveError(f"layer {i + 1} ({name}) of the save stream does not match the image's diffID")
        new = rewritten(i, name, member)
        if new is not None:
            refuse_a_rewritten_base_layer(i, digest, new, base_diff_ids, owned)
        elif i >= len(base_diff_ids) or base_diff_ids[i] != digest:
            raise VerificationError(f"layer {i + 1} ({digest}) lies outside {owned} but is not a layer of "
                                    "the base image; normalise only knows the layers unibake adds")
        walked.append((name, member, new or digest))
    return config_member.data or b"", walked


def end_of_load(loader: Consumer, config: bytes, tag: str, layer_names: tuple[str, ...] | list[str]) -> None:
    """Close a load stream: the config, a manifest naming ``tag`` and every layer, the end blocks."""
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": list(layer_names)}]).encode()
    for name, data in ((config_name, config), ("manifest.json", manifest)):
        loader.put(tar_header(name, len(data)) + data + tar_padding(len(data)))
    loader.put(bytes(2 * BLOCK))


def _finish(members: dict[str, Member], epoch: int, base_diff_ids: tuple[str, ...], owned: str,
            platform: Platform | None = None) -> tuple[Rewrite, list[str]]:
    """The new config and diffIDs once every layer has passed, and the load stream's layer names (a
    rewritten duplicate was saved as a link: the engine needs the file)."""
    def rewritten(i: int, name: str, member: Member) -> str | None:
        routed = member.routed
        return f"sha256:{routed.sha256.hexdigest()}" if isinstance(routed, RewrittenLayer) else None

    config_data, walked = walk_layers(members, base_diff_ids, owned, rewritten)
    diff_ids = tuple(d for _, _, d in walked)
    names = [m.routed.out_name if isinstance(m.routed, RewrittenLayer) else name for name, m, _ in walked]
    config = normalised_config(config_data, diff_ids, epoch, platform)
    return Rewrite(config=config, diff_ids=diff_ids, save_bytes=0), names


def _remembered(engine: Engine, memo: Path, built: BuiltImage, base_diff_ids: tuple[str, ...], epoch: int):
    """The image a memo says ``built`` was normalised to, when it plausibly is (its ID well-formed, the
    engine holding it, its labels ``built``'s own plus the epoch, its layers as many, the base's at
    the bottom); None otherwise: a damaged or planted memo means a rewrite, never another image."""
    try:
        remembered = read_small_text(memo, UnibakeError, limit=256, follow=False).strip()
    except UnibakeError:
        return None
    if not IMAGE_ID_RE.fullmatch(remembered):
        return None
    known, own = engine.inspect_image(remembered), engine.inspect_image(built.image_id)
    if known is None or own is None or known.labels != {**own.labels, EPOCH_LABEL: str(epoch)} or \
            len(known.diff_ids) != len(own.diff_ids) or \
            tuple(known.diff_ids[:len(base_diff_ids)]) != tuple(base_diff_ids):
        return None
    return known


def normalise_image(engine: Engine, built: BuiltImage, *, epoch: int, base_image: str, owned: str,
                    cache: Path | None = None, reuse: bool = True,
                    progress: Callable[[int], object] = lambda n: None, platform: Platform | None = None) -> Image:
    """Rewrite ``built`` as described above and point its tag at the result.

    ``cache``: a folder remembering which normalised image each built image gave, so that a build
    the engine took wholly from its cache is not rewritten again (kept outside the image: recording
    the built image's ID inside it would make the normalised ID depend on build times again).
    ``reuse=False`` (a cold build) still records, but does not look. ``platform``: what the config
    records (None: what the engine wrote).
    """
    where = f"-{platform.os}-{platform.architecture}" if platform else ""
    memo = cache / f"v{VERSION}-{built.image_id.removeprefix('sha256:')}-{epoch}{where}" if cache else None
    base = engine.inspect_image(base_image)
    if base is None:
        raise EngineError(f"the base image {base_image} is gone from the engine")
    known = _remembered(engine, memo, built, base.diff_ids, epoch) if reuse and memo is not None else None
    if known is not None:
        touch(memo)
        engine.tag(known.id, built.tag)
        return Image(ref=built.tag, image_id=known.id, diff_ids=known.diff_ids, labels=known.labels,
                     size=known.size, save_bytes=0, platform=image_platform(known))
    rewrite = rewrite_into(engine.load, lambda: engine.save(built.tag), tag=built.tag, epoch=epoch, owned=owned,
                           base_diff_ids=base.diff_ids, progress=progress, platform=platform)
    info = engine.inspect_image(built.tag)
    if info is None or info.id != rewrite.image_id or tuple(info.diff_ids) != rewrite.diff_ids:
        raise VerificationError(f"after normalising, {built.tag} is {info.id if info else 'missing'}, not the "
                                f"{rewrite.image_id} the rewritten config describes")
    if memo is not None and not linked_above(memo.parent, 1):
        try:  # a memo saves the next run a rewrite; one that cannot be written costs only that
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo.parent, memo.name, rewrite.image_id + "\n")
        except OSError:
            pass
        evict_oldest(memo.parent, "v*", MEMOS_KEPT)  # (one per build otherwise, for ever)
    return Image(ref=built.tag, image_id=info.id, diff_ids=info.diff_ids, labels=info.labels, size=info.size,
                 save_bytes=rewrite.save_bytes, platform=image_platform(info))
