"""One export does it all: normalise, archive and the round trip's load in a single pass over the
engine's save stream (the default; ``--sequential`` keeps the three stages apart).

Reading the built image's save stream once, every layer is

* ours (under the install root): rewritten (times set to the epoch, owner names emptied), hashed
  (its new diffID), sent to the local engine's load (the tag then names the normalised image),
  compressed into its own zstd frame for the archive, and sent to the fresh engine's load;
* the base image's: checked against the base's diffID, compressed into its frame, and sent to the
  fresh engine's load (the local engine has it).

When the stream ends, the new config is written and sent to both loads; while the engines unpack
what they were sent, the archive is assembled in its canonical form from the frames, and the
archive file is read back once: every file's sha256, the stream decoded and every diffID and the
config digest recomputed from the archive's own bytes.
So the fresh engine, which recomputes every diffID as it loads, holds an image with the same
diffIDs and config as the archive: the round trip's proof, without a second export or a second
read of the archive. A hotfix's fresh engine holds its base release, so its round trip loads the
(small) archive itself after the pass, as the sequential path does.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from .archive import (DEFAULT_LEVEL, SPOOL_THRESHOLD, Archive, Lender, _assemble, _disk_error, _Lent, _Spool,
                      canonical_entries, compressor, compressor_id)
from .archive_reader import FrameSeen, ReadBack, read_back
from .builder import BuiltImage, Image, image_platform
from .contents import LayerInspector
from .engine import Engine, LoadOutcome
from .errors import ArchiveError, EngineError, LayerFormatError, UnibakeError, VerificationError
from .imagetar import (BLOCK, LayerRewriter, Member, SavedImage, looks_like_layer, read_members, tar_header,
                       tar_padding)
from .manifest import RoundTripRecord
from .normalise import end_of_load, normalised_config, walk_layers
from .platforms import Platform
from .threads import Consumer, consume_in_thread, counted, hashing_thread, read_ahead


@dataclass(frozen=True, kw_only=True)
class PassedLayer:
    """A layer as the pass wrote it: its name in the load streams, its digest (final once the hashing
    thread is closed), whether it is ours (rewritten), and its frame or bytes for the archive."""

    out_name: str
    size: int
    ours: bool
    sha256: object
    spool: _Spool | _Raw | _Discard | _Lent | None
    data: bytes | None


class _Discard:
    """A hotfix's big base-image layer, which its base release shipped: the archive never holds it,
    so it is not compressed (the SBOM's reader still reads it, beside)."""

    def __init__(self, path: Path):
        self.path = path  # never written

    def write(self, data) -> None:
        pass

    def close(self) -> "_Discard":
        return self


class _Raw:
    """A hotfix's big layer of ours, kept as it is until its diffID says whether the archive ships it
    (compressed then into a :class:`_Spool`, once) or its base release did (dropped, never compressed).
    Only what ships is compressed: a hotfix changing one small layer no longer compresses the image."""

    def __init__(self, folder: Path, index: int):
        self.path = folder / f".member-{index:04d}.raw.tmp"
        self._fh = open(self.path, "wb")

    def write(self, data) -> None:
        try:
            self._fh.write(data)
        except OSError as exc:
            raise _disk_error(exc, self.path.parent) from None

    def close(self) -> "_Raw":
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                raise _disk_error(exc, self.path.parent) from None
            self._fh = None
        return self

    def pieces(self) -> Iterator[bytes]:
        with open(self.path, "rb") as fh:
            while piece := fh.read(1 << 20):
                yield piece


class _Layer:
    """One layer member of the save stream on its way to the loads and the archive."""

    def __init__(self, name: str, size: int, *, epoch: int, owned: str, local: Consumer, fresh: Consumer | None,
                 hasher: Consumer, spool: Callable[[bool], _Spool | _Raw | _Discard],
                 inspector: LayerInspector | None, fresh_has_base: bool = False, defer_local: bool = False):
        self.name, self.size, self.local, self.fresh, self.hasher = name, size, local, fresh, hasher
        # a hotfix whose base release the local engine holds: ours goes to the local load once its
        # diffID says the engine lacks it (``settled`` in :func:`export_once`), not as it streams
        self.defer_local = defer_local
        self.fresh_has_base = fresh_has_base  # the fresh engine holds the base image: its layers are not sent
        self.out_name = name if name.endswith("/layer.tar") else f"{posixpath.basename(name)}/layer.tar"
        self.inspector = inspector
        self.look = None  # the SBOM's reader of this layer, as it goes into the archive
        self.digest = hashlib.sha256()
        self.new_spool, self.big = spool, size > SPOOL_THRESHOLD
        self.spool = None  # made at the first byte, once it is known whose layer it is
        self.kept: list[bytes] | None = None if self.big else []
        self.held: list[bytes] = []  # the raw bytes read before the rewriter knows whose layer it is
        self.sent = 0
        self.rewriter = LayerRewriter(epoch=epoch, owned=owned, emit=self._ours)

    def _to_fresh(self, ours: bool) -> bool:
        return self.fresh is not None and (ours or not self.fresh_has_base)

    def _out(self, data, *, local: bool) -> None:
        if not self.sent:
            if self.big:
                self.spool = self.new_spool(local)  # (local: the layer is ours)
            header = tar_header(self.out_name, self.size)
            if local and not self.defer_local:
                self.local.put(header)
            if self._to_fresh(local):
                self.fresh.put(header)
            if self.inspector is not None and self.spool is not None:
                self.look = self.inspector.sink(self.out_name, self.size, bytes(data[:BLOCK]))
        self.sent += len(data)
        if local and not self.defer_local:
            self.local.put(data)
        if self._to_fresh(local):
            self.fresh.put(data)
        if self.spool is not None:
            self.spool.write(data)
            if self.look is not None:
                self.look.write(data)
        else:
            self.kept.append(bytes(data))

    def _ours(self, data) -> None:
        self.hasher.put((self.digest, data))
        self._out(data, local=True)

    def write(self, piece: memoryview) -> None:
        if self.rewriter.ours is None:
            self.held.append(bytes(piece))
            self.rewriter.write(piece)
            if self.rewriter.ours is False:  # the base image's: on as it is, from the first byte
                for data in self.held:
                    self._out(data, local=False)
                self.held = []
            elif self.rewriter.ours:
                self.held = []  # the rewriter has sent them on, rewritten
        elif self.rewriter.ours:
            self.rewriter.write(piece)
        else:
            self._out(piece, local=False)

    def close(self) -> PassedLayer:
        self.rewriter.close()
        if not self.rewriter.ours:
            for data in self.held:  # an empty layer: decided only at its end
                self._out(data, local=False)
        if self.sent != self.size:
            raise LayerFormatError(f"layer {self.name} went on as {self.sent} bytes, not {self.size}")
        padding = tar_padding(self.size)
        if self.rewriter.ours and not self.defer_local:
            self.local.put(padding)
        if self._to_fresh(bool(self.rewriter.ours)):
            self.fresh.put(padding)
        if self.spool is not None:
            self.spool.close()
        if self.look is not None:
            self.look.close()
        return PassedLayer(out_name=self.out_name, size=self.size, ours=bool(self.rewriter.ours), sha256=self.digest,
                           spool=self.spool, data=b"".join(self.kept) if self.kept is not None else None)


class _Known:
    """A layer's digest, known (a held layer's, as its release recorded it), where a hash object would be."""

    def __init__(self, digest: str):
        self._digest = digest

    def hexdigest(self) -> str:
        return self._digest


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What the one pass established: the normalised image, its archive, and the read back."""

    image: Image
    archive: Archive
    back: ReadBack
    round_trip: RoundTripRecord | None


def _finish(members: dict[str, Member], epoch: int, base_diff_ids: tuple[str, ...], owned: str,
            platform: Platform | None) -> tuple[bytes, tuple[str, ...], list[PassedLayer], tuple[str, ...]]:
    """The normalised config, its diffIDs, every layer in order, and the load stream's layer names."""
    def rewritten(i: int, name: str, member: Member) -> str | None:
        layer = member.routed
        if not isinstance(layer, PassedLayer):
            raise ArchiveError(f"layer {i + 1} ({name}) of the save stream is not a layer tar")
        return f"sha256:{layer.sha256.hexdigest()}" if layer.ours else None

    config_data, walked = walk_layers(members, base_diff_ids, owned, rewritten)
    diff_ids = tuple(d for _, _, d in walked)
    layers: list[PassedLayer] = [m.routed for _, m, _ in walked]
    return (normalised_config(config_data, diff_ids, epoch, platform), diff_ids, layers,
            tuple(layer.out_name for layer in layers))


def _layer_members(layers: list[PassedLayer], diff_ids: tuple[str, ...]) -> tuple[Member, ...]:
    """The layers as members of the canonical archive: named as loaded, their frames or bytes."""
    return tuple(Member(name=layer.out_name, size=layer.size, sha256=d.removeprefix("sha256:"),
                        content_sha256=d.removeprefix("sha256:"), data=layer.data, routed=layer.spool)
                 for layer, d in zip(layers, diff_ids))


@dataclass(frozen=True, kw_only=True)
class SaveSource:
    """A save stream :func:`export_once` reads instead of the engine's, as the engine's would be read (an
    assembled hotfix's, :func:`unibake.assemble.assembled_source`)."""

    stream: Iterable[bytes]
    # members that are layers of the base release (a hotfix's): never compressed or kept, only read (hashed,
    # the SBOM's reader); one whose diffID turns out not to be the base release's fails
    shared: frozenset[str] = frozenset()
    # members the stream's manifest names but does not carry, by name: (their place in the image, diffID,
    # size): layers of the base release the engine holds, taken as the base release recorded them (their
    # contents from the inspector's preload); they are left out of the archive
    held: Mapping[str, tuple[int, str, int]] = field(default_factory=dict)


def export_once(engine: Engine, built: BuiltImage, *, staging: Path, name: str, epoch: int, owned: str,
                base_image: str, fresh: Engine | None, level: int = DEFAULT_LEVEL, long_distance: bool = False,
                split: int | None = None, omit_base: tuple[str, ...] | None = None, threads: int = -1,
                progress: Callable[[int], object] = lambda n: None, platform: Platform | None = None,
                inspector: LayerInspector | None = None, fresh_holds: str | None = None,
                base_release: str | None = None, source: SaveSource | None = None,
                lender: Lender | None = None, fresh_done: Callable[[str], object] = lambda image_id: None,
                vouched: Mapping[str, FrameSeen] = {}) -> Exported:
    """Normalise ``built``, write its archive into ``staging``, and load it into ``fresh`` (an engine
    that never saw it; None: no round trip), reading the engine's save stream once.

    ``omit_base``: a hotfix: the diffIDs of the release it builds on; the archive leaves out the
    layers they share from the bottom, and ``fresh`` (which holds that release) is not fed here.
    ``platform``: what the config records (None: what the engine wrote). ``inspector`` reads every
    layer as it goes into the archive (the SBOM's contents, in the same pass).
    ``fresh_holds``: the base image's ID when ``fresh`` holds it (a seeded verify engine): the base
    image's layers are not sent to it, only the layers unibake added and the config (Engine 20.10
    takes an archive whose manifest names layers it already holds without their files).
    ``base_release``: a hotfix's base release by image ID: when the local engine holds it, the layers
    the hotfix shares with it are not loaded back into the local engine (it has them), only the others.
    ``source``: the image's save stream, when it is not the engine's (:class:`SaveSource`).
    ``lender``: with ``omit_base``, a whole release on an earlier one (``build --from``): the layers it shares
    with that release are not compressed but copied from its archive's frames, and the archive is whole;
    ``fresh`` holds that release already and is fed here, as for a cold release; what it was sent (what this
    release adds) is loaded by the time the archive is assembled, so its round trip is checked then and
    ``fresh_done(image_id)`` called (the pipeline lets go of the engine: stopped while the archive is read back).
    ``vouched``: frames an earlier read back decoded (:mod:`unibake.framememo`), for the read back.
    """
    start = time.monotonic()
    tag = built.tag
    base = engine.inspect_image(base_image)
    if base is None:
        raise EngineError(f"the base image {base_image} is gone from the engine")
    if fresh_holds is not None and base.id != fresh_holds:
        raise VerificationError(f"the base image {base_image} is {base.id} now, not the {fresh_holds} the verify "
                                "engine was seeded with")
    spools: list[_Spool | _Raw | _Discard] = []
    feed_fresh = fresh is not None and (omit_base is None or lender is not None)
    # a hotfix compresses only what it ships: its base release shipped the base image's layers when it
    # holds them at its bottom (they are then omitted), and a layer of ours waits for its diffID
    base_shipped = omit_base is not None and tuple(omit_base[:len(base.diff_ids)]) == tuple(base.diff_ids)
    held = engine.inspect_image(base_release) if omit_base is not None and base_release else None
    defer_local = held is not None and tuple(held.diff_ids) == tuple(omit_base)
    cctx = compressor(level, long_distance, threads)
    save_count = {"bytes": 0}
    out = trip = None

    def real_spool() -> _Spool:
        spools.append(_Spool(staging, len(spools), compressor(level, long_distance, threads)))
        return spools[-1]

    shared = source.shared if source is not None else frozenset()
    held_layers = source.held if source is not None else {}
    shared_out = frozenset(n if n.endswith("/layer.tar") else f"{posixpath.basename(n)}/layer.tar" for n in shared)

    def new_spool(ours: bool, member: str = "") -> _Spool | _Raw | _Discard:
        if member in shared:
            spools.append(_Discard(staging / f".member-{len(spools):04d}.discarded"))
        elif omit_base is not None and ours:
            spools.append(_Raw(staging, len(spools)))
        elif base_shipped:
            spools.append(_Discard(staging / f".member-{len(spools):04d}.discarded"))
        else:
            return real_spool()
        return spools[-1]

    def settled(layer: PassedLayer, omitted: bool, local: Consumer) -> PassedLayer:
        """What a hotfix deferred, done in one read of the layer: compressed into its frame when the
        archive ships it, sent to the local load when the local engine lacks it (``defer_local``)."""
        if omitted:
            return layer
        if isinstance(layer.spool, _Discard):  # _finish holds the base's layers to the base image's diffIDs
            raise VerificationError(f"the base image's layer {layer.out_name} is not one the base release holds"
                                    if layer.out_name not in shared_out and layer.out_name not in held_layers else
                                    f"the base release's layer {layer.out_name} is not one it holds")
        raw = layer.spool if isinstance(layer.spool, _Raw) else None
        to_local = defer_local and layer.ours
        if raw is None and not to_local:
            return layer
        frame = real_spool() if raw is not None else None
        if to_local:
            local.put(tar_header(layer.out_name, layer.size))
        for piece in raw.pieces() if raw is not None else (layer.data,):
            if to_local:
                local.put(piece)
            if frame is not None:
                frame.write(piece)
        if to_local:
            local.put(tar_padding(layer.size))
        if raw is None:
            return layer
        raw.path.unlink(missing_ok=True)
        return replace(layer, spool=frame.close())

    def advance(n: int) -> None:
        save_count["bytes"] += n
        progress(n)

    try:
        local = consume_in_thread(engine.load, name="load")
        remote = consume_in_thread(fresh.load, name="fresh-load") if feed_fresh else None
        with local, hashing_thread() as hasher:
            with remote if remote is not None else nullcontext():
                def route(member: str, size: int, head: bytes):
                    if not looks_like_layer(member, head):
                        return None
                    return _Layer(member, size, epoch=epoch, owned=owned, local=local, fresh=remote, hasher=hasher,
                                  spool=partial(new_spool, member=member), inspector=inspector,
                                  fresh_has_base=fresh_holds is not None,
                                  defer_local=defer_local)

                try:
                    stream = engine.save(tag) if source is None else source.stream
                    members = read_members(counted(read_ahead(stream, name="save"), advance), route=route)
                except LayerFormatError as exc:
                    raise ArchiveError(f"cannot normalise the image's save stream: {exc}") from None
                hasher.close()
                for member, (place, diff_id, size) in held_layers.items():
                    if member in members:
                        raise ArchiveError(f"the save stream carries {member}, which it was to leave out")
                    digest = diff_id.removeprefix("sha256:")
                    spools.append(_Discard(staging / f".member-{len(spools):04d}.discarded"))
                    members[member] = Member(name=member, size=size, sha256=digest, content_sha256=digest, data=None,
                                             routed=PassedLayer(out_name=member, size=size,
                                                                ours=place >= len(base.diff_ids),
                                                                sha256=_Known(digest), spool=spools[-1], data=None))
                config, diff_ids, layers, names = _finish(members, epoch, base.diff_ids, owned, platform)
                omit = _shared_prefix(omit_base, diff_ids) if omit_base is not None else ()
                layers = [settled(layer, d in omit, local) for layer, d in zip(layers, diff_ids)]
                if lender is not None:  # a whole release: what it shares with the earlier one, from that one's frames
                    layers = [_lent(lender, layer, d) if d in omit else layer for layer, d in zip(layers, diff_ids)]
                    omit = ()
                end_of_load(local, config, tag, names)
                local.end()  # the load's request ends here, so each engine stores what it was sent meanwhile
                if remote is not None:
                    end_of_load(remote, config, tag, names)
                    remote.end()
                # Both engines now take in what they were sent (Engine 20.10 unpacks a load only once
                # its stream has ended: seconds for a big image); the archive is assembled and read
                # back meanwhile, and the loads are waited for after.
                image_id = f"sha256:{hashlib.sha256(config).hexdigest()}"
                saved = SavedImage(layout="docker", image_id=image_id, diff_ids=diff_ids, repo_tags=(tag,),
                                   config=json.loads(config), members=len(members), config_bytes=config,
                                   layer_members=_layer_members(layers, diff_ids))
                contents = inspector.finish(saved) if inspector is not None else None
                out, uncompressed = _assemble(canonical_entries(saved, tag, frozenset(omit)), staging, name, split,
                                              cctx, compressor_id(level, long_distance))
                files = out.finish()
                archive = Archive(folder=staging, name=name, files=files, compressed_bytes=out.total,
                                  uncompressed_bytes=uncompressed, level=level, long_distance=long_distance,
                                  image=saved, seconds=time.monotonic() - start, tag=tag,
                                  shipped=tuple(d for d in diff_ids if d not in omit),
                                  omitted=tuple(d for d in diff_ids if d in omit),
                                  contents=contents, frames=out.frames)
                if remote is not None and lender is not None:  # (small: loaded while the archive was assembled)
                    trip = _fresh_trip(fresh, remote.close(), image_id, diff_ids, tag, fresh_holds, start)
                    fresh_done(image_id)
                back = read_back(archive, omitted=frozenset(archive.omitted), bind_frames=True, vouched=vouched)
                if remote is not None and trip is None:
                    loaded: LoadOutcome = remote.close()
                local.close()
        info = engine.inspect_image(tag)
        if info is None or info.id != image_id or tuple(info.diff_ids) != diff_ids:
            raise VerificationError(f"after normalising, {tag} is {info.id if info else 'missing'}, not the "
                                    f"{image_id} the rewritten config describes")
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        for s in spools:
            try:
                s.close()
            except UnibakeError:
                pass
            s.path.unlink(missing_ok=True)
    image = Image(ref=tag, image_id=info.id, diff_ids=info.diff_ids, labels=info.labels, size=info.size,
                  save_bytes=save_count["bytes"], platform=image_platform(info))
    if feed_fresh and trip is None:
        trip = _fresh_trip(fresh, loaded, image_id, diff_ids, tag, fresh_holds, start)
    return Exported(image=image, archive=archive, back=back, round_trip=trip)


def _fresh_trip(fresh: Engine, loaded: LoadOutcome, image_id: str, diff_ids: tuple[str, ...], tag: str,
                fresh_holds: str | None, start: float) -> RoundTripRecord:
    """The fresh engine's load checked: it holds the image, by ID and diffIDs, under its tag."""
    held = fresh.inspect_image(image_id)
    if held is None or tuple(held.diff_ids) != diff_ids:
        raise VerificationError(f"the fresh engine at {fresh.address} does not hold {image_id} after the load "
                                f"(it said: {'; '.join(loaded.messages[-3:])})")
    tagged = fresh.inspect_image(tag)
    if tagged is None or tagged.id != image_id:
        raise VerificationError(f"after the load, {tag} does not name {image_id} in the fresh engine")
    return RoundTripRecord(engine=fresh.address, engine_version=fresh.version(), method="stream",
                           image_id=held.id, diff_ids=held.diff_ids, tags=loaded.tags,
                           held_before=(fresh_holds,) if fresh_holds else (), seconds=round(time.monotonic() - start, 3))


def _lent(lender: Lender, layer: PassedLayer, diff_id: str) -> PassedLayer:
    """A layer the earlier release shipped, as this archive lays it out: that archive's frame of it (copied
    when the archive is assembled), or a small one's bytes."""
    found = lender.lend(diff_id.removeprefix("sha256:"), layer.size)
    if found is None:
        raise ArchiveError(f"{lender.what} does not hold the layer {diff_id} ({layer.size} bytes) as its frame "
                           "index says it shipped it; make the release without --from")
    if isinstance(found, _Lent):
        return replace(layer, spool=found, data=None)
    return replace(layer, spool=None, data=found)


def _shared_prefix(base_diff_ids: tuple[str, ...], diff_ids: tuple[str, ...]) -> tuple[str, ...]:
    from .hotfix import omitted_layers

    return omitted_layers(base_diff_ids, diff_ids)
