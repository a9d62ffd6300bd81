"""A hotfix assembled from the layers that changed: the whole image is neither built nor exported.

A hotfix changes what lies below the build memo's marker (tune caches, overlays, the metadata); the
steps above it are the memo's image, whose layers, normalised, the base release already holds. When
every condition below holds, the hotfix is made so:

1. a small base is loaded into the engine: one layer holding the install root's parent folders
   (``opt/``, ``opt/unibake/``) as the memo's image has them (mode and owner: a COPY writes its
   destination's parents as they are below it), with the memo image's own settings (env, labels,
   shell, user, ...) and as many history entries as it has (all but the last marked empty: Engine
   20.10 refuses a config naming more non-empty history entries than layers);
2. the steps below the marker are built FROM it by the classic builder, from the same context and
   build arguments, the in-image checks' RUN left out: the small image (small layers, built in a
   second or two, from the build cache after the first);
3. the export reads, instead of the engine's save stream of the whole image, a stream assembled from
   the base release's archive (the bottom layers: the memo image's, as the base release shipped them)
   and the small image's save (its top layers), with the config the whole build writes: the small
   build's, with the base release's history of the bottom steps and the in-image checks' entry put
   back. The export does with it what it does for any hotfix: every layer rewritten and hashed (the
   bottom ones come out as they went in), the config normalised, only the layers the base release
   lacks compressed and loaded into the local engine (which holds the base release), the rest left out;
4. the in-image checks run as a container of the image, which must change nothing in it: as their
   RUN step in the whole build, which then records no layer.

Where the engine's storage can be read (and not with ``--engine-save``), steps 1-4 are simpler
(:func:`_assemble_on_memo`): the steps below the marker are built FROM the memo's image itself (no small
base, no folders read), only the small image's top layers are taken, from the storage (each hashed
against its diffID; else the engine's save), and the checks run in a container of the small image,
which holds every file.

The image is the one the whole build gives (its ID): the engine test
``tests/engine/test_hotfix_repro.py`` holds an assembled hotfix (both ways) to a cold build of the same
inputs. Conditions, each said when it fails (the whole image is then built and exported, as before):
the build memo holds the steps above the marker; this user's record (made by every run that
exports a whole image built FROM the memo's image) says which diffIDs that image's layers got with
the base release's SOURCE_DATE_EPOCH, and they are the base release's bottom layers; the engine holds
the base release's image; the part below the marker runs nothing but the checks; the engine tells
the install root's parent folders and the memo image's settings. ``hotfix --full-build`` builds and
exports the whole image instead.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import io
import json
import os
import secrets
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from . import buildmemo
from .archive_reader import read_archive
from .builder import CHECK_ERROR_RE, BuiltImage, _build, _hold, _release, cache_ref, iso_time, keep_as_cache
from .contents import found_from_json, found_to_json
from .engine import BuildOutcome, BuildStep, Engine
from .errors import ArchiveError, CheckFailed, EngineError, StoreMismatch, UnibakeError, VerificationError
from .files import evict_oldest, linked_above, read_small_file, touch, write_atomic
from .hotfix import HotfixBase
from .export import SaveSource
from .imagetar import BLOCK, CAPTURE, DROP, PASS, filter_members, tar_header, tar_padding
from .layerstore import StoredImage, layer_tar, stored_image
from .render import BuildContext, ContextFile

CHECKS_PREFIX = "skip=; for p in "  # the in-image checks' RUN, as unibake renders it (templates/Dockerfile.j2)
CONFIG_LIMIT = 64 << 20  # the base release's config, read from its archive
PIECE = 1 << 20
# how to have an image built whole instead, said where one assembled on an earlier release cannot be made
WHOLE = "build it whole: a hotfix with --full-build, a release without --from (or with --no-from)"


@dataclass(frozen=True, kw_only=True)
class Assembly:
    """What the export needs to assemble the hotfix's save stream."""

    small: str  # the small image's ID
    lower_layers: int  # its layers: the base release's bottom ones
    lower_history: tuple[str, ...]  # the created_by of its history entries
    checks: str  # the in-image checks' command (the RUN's, as rendered)
    shell: tuple[str, ...]  # what runs it (the memo image's SHELL, else /bin/sh -c)
    checks_created_by: str  # their history entry's created_by, as the whole build records it
    checks_at: int  # that entry's place in the image's history
    on_memo: bool = False  # the small image built FROM the memo's image itself (else FROM a small base)

    @property
    def below(self) -> int:
        """The small image's layers under its top ones: the memo image's, or the small base's one."""
        return self.lower_layers if self.on_memo else 1


def _parents(root: str) -> list[str]:
    parts = root.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _small_base(folders: list[tuple[str, tuple[int, int, int]]], settings: dict, history: list[str],
                epoch: int, ref: str) -> tuple[bytes, bytes]:
    """(the small base's config, the docker-save tar that loads it as ``ref``)."""
    layer = io.BytesIO()
    # (PAX: a folder an OpenShift-style owner holds, uid 1000650000, is past what ustar's header holds, 2097151, and
    # was a ValueError's traceback; an owner that fits is written as ustar writes it, with no extended header)
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (mode, uid, gid) in folders:
            info = tarfile.TarInfo(path.strip("/") + "/")
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, mode, uid, gid, epoch
            tar.addfile(info)
    data = layer.getvalue()
    stamp = iso_time(epoch)
    config = {key: value for key, value in settings.items() if key != "config"}
    config.update(config=settings["config"], created=stamp,
                  history=[{"created": stamp, "created_by": c, "empty_layer": True} for c in history[:-1]]
                  + [{"created": stamp, "created_by": history[-1]}],
                  rootfs={"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(data).hexdigest()}"]})
    raw = json.dumps(config, sort_keys=True).encode()
    name = f"{hashlib.sha256(raw).hexdigest()}.json"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member, content in ((name, raw), ("layer/layer.tar", data), ("manifest.json", json.dumps(
                [{"Config": name, "RepoTags": [ref], "Layers": ["layer/layer.tar"]}]).encode())):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return raw, archive.getvalue()


def _small_context(context: BuildContext, cut: buildmemo.Split, memo: buildmemo.Memo, base_id: str | None,
                   checks_line: str) -> BuildContext | None:
    """The memo's context of the part below the marker, FROM the small base (``base_id``; None: FROM the
    memo's image itself), the checks' RUN left out."""
    upper = buildmemo.upper_context(context, cut, memo)
    lines = upper.dockerfile.split("\n")
    froms = [i for i, line in enumerate(lines) if line == f"FROM {memo.lower}"]
    runs = [i for i, line in enumerate(lines) if line.strip() == checks_line]
    if len(froms) != 1 or len(runs) != 1:
        return None
    if base_id is not None:
        lines[froms[0]] = f"FROM {base_id}"
    del lines[runs[0]]
    dockerfile = "\n".join(lines)
    data = dockerfile.encode()
    files = tuple(ContextFile(name="Dockerfile", mode=0o644, sha256=hashlib.sha256(data).hexdigest(), data=data)
                  if f.name == "Dockerfile" else f for f in upper.files)
    return replace(upper, dockerfile=dockerfile, files=files)


def try_assemble(context: BuildContext, engine: Engine, *, product: str, tag: str, base: HotfixBase, memo: Path,
                 memo_key: bytes, epoch: int, revision: str, platform: str | None, owned: str,
                 on_line: Callable[[str], None], tags: list[str], use_store: bool = True) -> BuiltImage | str:
    """The hotfix's small image, ready for :func:`assembled_stream`; or why it cannot be assembled. Where the
    engine's storage can be read (and ``use_store``), built on the memo's image itself; else on a small base.
    ``tags``: the caller's list of tags to remove as its run ends (:func:`unibake.builder._release`); the small
    image is built under a tag of this run's own, put there, so that another run of the same selection (whose
    small build moves the selection's cache tag to its own image and removes the one it named) cannot take it
    away before the export has read it."""
    start = time.monotonic()
    release = base.manifest.release
    cut = buildmemo.split(context.dockerfile)
    if cut is None:
        return "the Dockerfile has no build memo marker"
    key = buildmemo.inputs_digest(context, cut, engine, platform)
    if key is None:
        return "an image a FROM above the build memo's marker names is not in the engine"
    hit = buildmemo.lookup(memo, context.selection, platform, key, cut, engine, memo_key)
    if hit is None:
        return "the build memo holds no image of the steps above its marker for these inputs"
    released = engine.inspect_image(base.manifest.image_id)
    if released is None or tuple(released.diff_ids) != tuple(base.manifest.diff_ids):
        return f"the engine does not hold release {release}'s image {base.manifest.image_id[:19]}"
    lower = engine.inspect_image(hit.lower)
    if lower is None:
        return "the build memo's image went from the engine"
    count = len(lower.diff_ids)
    known = buildmemo.remembered_lower(memo, context.selection, platform, hit.lower, epoch, memo_key)
    if known is None or len(known) != count:
        return (f"no record here of the diffIDs the build memo's image gets with SOURCE_DATE_EPOCH={epoch} (every "
                "release that builds and exports the whole image records it)")
    if known != tuple(base.manifest.diff_ids[:count]) or count >= len(base.manifest.diff_ids):
        return f"the steps above the build memo's marker changed since release {release}"
    steps = buildmemo.instructions(cut.upper)
    runs = [i for i, s in enumerate(steps) if s.split(None, 1)[0].upper() in ("RUN", "ADD", "ONBUILD", "SHELL")]
    if len(runs) != 1 or not steps[runs[0]].startswith("RUN " + CHECKS_PREFIX):
        return "the part of the Dockerfile below the build memo's marker runs more than the in-image checks"
    checks = steps[runs[0]][len("RUN "):]
    settings = engine.image_config(hit.lower)
    history = engine.history(hit.lower)
    if settings is None or not history:
        return "the engine does not give the build memo image's settings and history"
    # the base release's image must record the memo image's steps below its own (the history the assembled
    # config takes from it, checked again as the export reads it): a release made before the Dockerfile's
    # layout changed (another unibake) holds the same layers under other steps, and is built on whole
    base_history = engine.history(base.manifest.image_id)
    if base_history[:len(history)] != history:
        return (f"release {release}'s history of the steps above the build memo's marker is not the memo image's "
                "(a Dockerfile laid out otherwise, by another unibake?)")
    shell = settings["config"].get("Shell") or ["/bin/sh", "-c"]
    # its in-image checks must be this build's step too (the assembled config takes that step's entry from it,
    # checked again as the export reads it): another selection of profiles checks others, and a release whose steps
    # below the marker lie otherwise (made by an earlier unibake) has them at another place; either is built on whole
    at = len(history) + runs[0]
    if at >= len(base_history) or base_history[at] != " ".join([*shell, checks]):
        return (f"release {release}'s in-image checks are another step than this build's (another selection of "
                "profiles, or steps below the build memo's marker laid out otherwise, by another unibake?)")
    small_ref = cache_ref(product, context.selection, "assembled")
    token = f"{os.getpid()}x{secrets.token_hex(3)}"
    own_ref = cache_ref(product, context.selection, f"assembled-{token}")
    tags.append(own_ref)  # (before the build puts it: an interrupt as the build ends leaves no tag behind)
    if use_store and not isinstance(stored_image(engine, hit.lower), str):
        return _assemble_on_memo(context, engine, cut=cut, hit=hit, history=history, runs=runs, checks=checks,
                                 shell=shell, count=count, small_ref=small_ref, own_ref=own_ref, product=product, tag=tag, base=base,
                                 epoch=epoch, revision=revision, platform=platform, on_line=on_line, start=start)
    folders = _folders_of(engine, memo, memo_key, hit.lower, _parents(owned))
    if isinstance(folders, str):
        return folders
    base_ref = cache_ref(product, context.selection, f"assembled-base-{token}")  # (another run's is another)
    raw, archive = _small_base(folders, settings, history, epoch, base_ref)
    pinned: list[str] = []
    try:  # the small base's name removed however this ends (the small image holds its base)
        engine.load([archive])
        base_info = engine.inspect_image(base_ref)
        if base_info is None or base_info.id != f"sha256:{hashlib.sha256(raw).hexdigest()}":
            raise EngineError(f"the small base of the assembled hotfix did not load as {base_ref}")
        small_context = _small_context(context, cut, hit, base_info.id, "RUN " + checks)
        if small_context is None:
            return "the Dockerfile below the build memo's marker is not the one unibake renders"
        # the memo's stage images (COPY --from) held while the small build reads them
        if not _hold(engine, product, context.selection, hit.stages, pinned):
            return "the build memo's images went from the engine"
        on_line(f"assembling the image: the steps below the build memo's marker built FROM a small base "
                f"({len(folders)} folder(s), the settings of {hit.lower[:19]}), the in-image checks run after")
        outcome = _build(small_context, engine, tag=own_ref, product=product, revision=revision, epoch=epoch,
                         nocache=False, on_line=on_line, platform=platform)
    finally:
        _release(engine, pinned)
        engine.untag(base_ref)
    # the selection's cache tag (the next small build's cache) moved to it; the image it named is removed unless
    # a tag still names it (another run's own, while that run reads it)
    keep_as_cache(engine, small_ref, outcome.image_id)
    return _built(engine, outcome, cut=cut, hit=hit, tag=tag, base=base, start=start, assembly=Assembly(
        small=outcome.image_id, lower_layers=count, lower_history=tuple(history), checks=checks, shell=tuple(shell),
        checks_created_by=" ".join([*shell, checks]), checks_at=len(history) + runs[0]))


def _built(engine: Engine, outcome: BuildOutcome, *, cut: buildmemo.Split, hit: buildmemo.Memo, tag: str, base: HotfixBase,
           start: float, assembly: Assembly) -> BuiltImage:
    """The build stage's report of an assembled image: the steps above the marker as memoised, the small
    build's below them with the whole Dockerfile's numbers."""
    lower_steps = [BuildStep(number=n, instruction=text, cached=not text.upper().startswith("FROM "))
                   for n, text in enumerate(buildmemo.instructions(cut.lower), 1)]
    upper_steps = [replace(s, number=s.number - 1 + cut.lower_steps) for s in outcome.steps[1:]]
    now = engine.inspect_image(tag)
    return BuiltImage(image_id=outcome.image_id, tag=tag, diff_ids=(), steps=(*lower_steps, *upper_steps),
                      stage_images=hit.stages, seconds=time.monotonic() - start, size=base.manifest.image_size,
                      replaced=now.id if now is not None else None,
                      memoised=sum(1 for s in lower_steps if s.cached), memo_lower=hit.lower, assembled=assembly)


def _assemble_on_memo(context: BuildContext, engine: Engine, *, cut: buildmemo.Split, hit: buildmemo.Memo,
                      history: list[str], runs: list[int], checks: str, shell: list[str], count: int, small_ref: str, own_ref: str,
                      product: str, tag: str, base: HotfixBase, epoch: int, revision: str, platform: str | None,
                      on_line: Callable[[str], None], start: float) -> BuiltImage | str:
    """:func:`try_assemble` where the engine's storage can be read: the steps below the marker built ``FROM``
    the build memo's image itself (no small base, no folders to read: the image's own), the checks' RUN left
    out. The export takes only its top layers, from the storage (:func:`save_small`), and the checks run in a
    container of it as it is (:func:`check_early`): no image loaded for them."""
    small_context = _small_context(context, cut, hit, None, "RUN " + checks)
    if small_context is None:
        return "the Dockerfile below the build memo's marker is not the one unibake renders"
    pinned: list[str] = []
    try:  # the memo's image and its stage images held while the small build reads them
        if not _hold(engine, product, context.selection, (hit.lower, *hit.stages), pinned):
            return "the build memo's images went from the engine"
        on_line(f"assembling the image: the steps below the build memo's marker built FROM its image "
                f"{hit.lower[:19]}, the in-image checks run after")
        outcome = _build(small_context, engine, tag=own_ref, product=product, revision=revision, epoch=epoch,
                         nocache=False, on_line=on_line, platform=platform)
    finally:
        _release(engine, pinned)
    keep_as_cache(engine, small_ref, outcome.image_id)  # (as on a small base, above)
    small = engine.inspect_image(outcome.image_id)
    lower = engine.inspect_image(hit.lower)
    if small is None or lower is None or tuple(small.diff_ids[:count]) != tuple(lower.diff_ids) \
            or len(small.diff_ids) <= count:
        raise EngineError(f"the small image {outcome.image_id[:19]} does not lie on the build memo's image "
                          f"{hit.lower[:19]}")
    return _built(engine, outcome, cut=cut, hit=hit, tag=tag, base=base, start=start, assembly=Assembly(
        small=outcome.image_id, lower_layers=count, lower_history=tuple(history), checks=checks, shell=tuple(shell),
        checks_created_by=" ".join([*shell, checks]), checks_at=len(history) + runs[0], on_memo=True))


RECORDS = "layers"  # under the build memo's folder: what each layer a release's pass read holds, by diffID
CONFIGS = "configs"  # and the configs of the images it released, by digest
FOLDERS = "folders"  # and the headers of the folders above the install root in each build memo image, by image ID
LAYER_RECORDS_KEPT = 64
CONFIGS_KEPT = 16
RECORD_LIMIT = 1 << 30


def _folders_mac(secret_key: bytes, image_id: str, paths: list[str], folders: list) -> str:
    text = json.dumps({"image": image_id, "paths": paths, "folders": folders}, sort_keys=True)
    return hmac.new(secret_key, f"unibake folders record {buildmemo.VERSION}\n{text}".encode(),
                    hashlib.sha256).hexdigest()


def _folders_of(engine: Engine, memo: Path, secret_key: bytes, image_id: str,
                paths: list[str]) -> list[tuple[str, tuple[int, int, int]]] | str:
    """The header (mode, owner, group) of each of ``paths`` that the image ``image_id`` holds, as the small base
    lays them out; or why not. Each is read through a container the engine creates (about 0.1 s a folder); an
    image ID names its files for ever, so what was read is kept, signed with this user's key (a record a checkout
    brings would set the folders' modes of the hotfix's layers), under the build memo's folder."""
    where = memo / FOLDERS
    path = where / f"{image_id.removeprefix('sha256:')}.json"
    try:
        raw = json.loads(read_small_file(path, UnibakeError, limit=1 << 16, follow=False).decode("utf-8"))
        kept = raw["folders"]
        if raw.get("version") == buildmemo.VERSION and raw.get("image") == image_id and raw.get("paths") == paths \
                and isinstance(raw.get("mac"), str) \
                and hmac.compare_digest(raw["mac"], _folders_mac(secret_key, image_id, paths, kept)):
            folders = [(p, tuple(h)) for p, h in kept]
            if all(p in paths and len(h) == 3 and all(type(v) is int for v in h) for p, h in folders):
                touch(path)
                return folders
    except (UnibakeError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pass  # (RecursionError: JSON nested deeper than the stack)
    folders = []
    for folder in paths:
        header = engine.folder_header(image_id, folder)
        if isinstance(header, str):
            return f"{folder} in the build memo's image: {header}"
        if header is not None:
            folders.append((folder, tuple(header)))
    body = [[p, list(h)] for p, h in folders]
    try:
        if linked_above(where):
            return folders  # (not kept: written, and the older ones evicted, wherever the link points)
        where.mkdir(parents=True, exist_ok=True)
        write_atomic(where, path.name, json.dumps({"version": buildmemo.VERSION, "image": image_id, "paths": paths,
                                                   "folders": body,
                                                   "mac": _folders_mac(secret_key, image_id, paths, body)}))
        evict_oldest(where, "*.json", CONFIGS_KEPT)
    except (OSError, UnibakeError):  # (not kept: the next hotfix reads them again)
        pass
    return folders


def _record_mac(secret_key: bytes, body: bytes) -> str:
    """The MAC of a layer record's body, its bytes as written: checked before the body is parsed (a record of a GiB
    a checkout planted, parsed first, took six times that in memory)."""
    return hmac.new(secret_key, f"unibake layer record {buildmemo.VERSION}\n".encode() + body,
                    hashlib.sha256).hexdigest()


def remember_layers(folder: Path, secret_key: bytes, layers: Iterable[tuple[str, int, object]]) -> None:
    """After a pass that read them: each layer's size and what it holds of interest (the SBOM's reader's
    record of it), by diffID, signed with this user's key: a later assembled hotfix takes its base
    release's bottom layers from these instead of reading them again. The newest LAYER_RECORDS_KEPT kept."""
    where = folder / RECORDS
    if linked_above(where):
        return  # (not kept: written, and the older ones evicted, wherever the link points)
    made = False
    for diff_id, size, found in layers:
        path = where / f"{diff_id.removeprefix('sha256:')}.json"
        if remembered_layer(folder, secret_key, diff_id) is not None:  # (taken as used; one not signed so is replaced)
            continue
        # its MAC on a line of its own, then the body it signs: {version, diff_id, size, found}
        body = json.dumps({"version": buildmemo.VERSION, "diff_id": diff_id, "size": size,
                           "found": found_to_json(found)}).encode()
        where.mkdir(parents=True, exist_ok=True)
        write_atomic(where, path.name, _record_mac(secret_key, body).encode() + b"\n" + body)
        made = True
    if made:
        evict_oldest(where, "*.json", LAYER_RECORDS_KEPT)


def remembered_layer(folder: Path, secret_key: bytes, diff_id: str) -> tuple[int, object] | None:
    """(size, what it holds) of the layer ``diff_id`` as :func:`remember_layers` recorded it with this user's
    key; None otherwise (missing, not signed so, not readable)."""
    try:
        path = folder / RECORDS / f"{diff_id.removeprefix('sha256:')}.json"
        mac, _, body = read_small_file(path, UnibakeError, limit=RECORD_LIMIT, follow=False).partition(b"\n")
        if not hmac.compare_digest(mac, _record_mac(secret_key, body).encode()):
            return None  # (not this user's, or of an earlier form: never parsed)
        raw = json.loads(body.decode("utf-8"))
        size, found = raw["size"], raw["found"]
        if raw.get("version") != buildmemo.VERSION or raw.get("diff_id") != diff_id or type(size) is not int \
                or size < 0:
            return None
        touch(path)
        return size, found_from_json(found)
    except (UnibakeError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # (RecursionError: JSON nested deeper than the stack)


def remember_config(folder: Path, config: bytes) -> None:
    """A released image's config, by its digest (its image ID: it proves itself)."""
    where = folder / CONFIGS
    digest = hashlib.sha256(config).hexdigest()
    name = f"{digest}.json"
    if linked_above(where) or remembered_config(folder, f"sha256:{digest}") is not None:  # (used; another replaced)
        return
    where.mkdir(parents=True, exist_ok=True)
    write_atomic(where, name, config)
    evict_oldest(where, "*.json", CONFIGS_KEPT)


def remembered_config(folder: Path, image_id: str) -> bytes | None:
    path = folder / CONFIGS / f"{image_id.removeprefix('sha256:')}.json"
    try:
        data = read_small_file(path, UnibakeError, limit=CONFIG_LIMIT, follow=False)
    except UnibakeError:
        return None
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != image_id:
        return None
    touch(path)
    return data


@dataclass(frozen=True, kw_only=True)
class Held:
    """A hotfix's bottom layers as earlier passes recorded them: not read again."""

    config: bytes  # the base release's config
    layers: tuple[tuple[str, int, str, int, object], ...]  # (member name, place, diffID, size, what it holds)


def held_bottom(folder: Path, secret_key: bytes | None, assembly: Assembly, base: HotfixBase) -> Held | None:
    """The base release's config and its bottom layers' records, when this user's records hold them all;
    None otherwise (the base release's archive is then read for them)."""
    if secret_key is None:
        return None
    config = remembered_config(folder, base.manifest.image_id)
    if config is None:
        return None
    layers = []
    for place, diff_id in enumerate(base.manifest.diff_ids[:assembly.lower_layers]):
        record = remembered_layer(folder, secret_key, diff_id)
        if record is None:
            return None
        layers.append((f"held{place}/layer.tar", place, diff_id, record[0], record[1]))
    return Held(config=config, layers=tuple(layers))


@dataclass(frozen=True, kw_only=True)
class SmallSave:
    """The small image's save stream, spooled once for both the export and the checks."""

    path: Path
    config: dict
    layers: tuple[str, ...]  # its layers' member names
    diff_ids: tuple[str, ...]

    def linked(self, name: str) -> SmallSave:
        """The same spool under a second name, for a reader that removes its own name when it is done,
        whenever the other is: a hard link (no copy), or a copy where the folder's file system has none."""
        other = self.path.with_name(name)
        other.unlink(missing_ok=True)
        try:
            os.link(self.path, other)
        except OSError:
            try:
                shutil.copyfile(self.path, other)
            except BaseException:
                other.unlink(missing_ok=True)
                raise
        return replace(self, path=other)


def save_small(engine: Engine, assembly: Assembly, staging: Path,
               on_fallback: Callable[[str], object] = lambda message: None) -> SmallSave:
    """The small image's save stream in a file of ``staging`` (the caller removes it). Built on the memo's
    image (``assembly.on_memo``), only its top layers are wanted: read from the engine's storage, each
    hashed against its diffID as it is written; where they are not the image's (``on_fallback`` told why),
    or cannot be read there, from the engine's save of the whole image."""
    spool = staging / ".assembled-small.tar.tmp"
    try:
        stored = stored_image(engine, assembly.small) if assembly.on_memo else None
        if isinstance(stored, StoredImage):
            try:
                _spool_top(stored, assembly.below, spool)
            except StoreMismatch as exc:
                on_fallback(f"the engine's storage did not give the small image's own top layers ({exc}); they are "
                            "read from the engine's save of the whole image instead")
                stored = None
        if not isinstance(stored, StoredImage):
            with open(spool, "wb") as fh:
                for piece in engine.save(assembly.small):
                    fh.write(piece)
        with tarfile.open(spool, "r:") as saved:
            try:
                entry = json.load(saved.extractfile("manifest.json"))[0]
                config = json.loads(saved.extractfile(entry["Config"]).read())
                layers, diff_ids = tuple(entry["Layers"]), tuple(config["rootfs"]["diff_ids"])
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, tarfile.TarError) as exc:
                raise ArchiveError(f"the small image's save stream is not one the engine writes: {exc}") from None
        if len(layers) != len(diff_ids) or len(layers) <= assembly.below:
            raise ArchiveError("the small image's save stream names other layers than its config")
    except BaseException:
        spool.unlink(missing_ok=True)
        raise
    return SmallSave(path=spool, config=config, layers=layers, diff_ids=diff_ids)


def _spool_top(stored: StoredImage, below: int, spool: Path) -> None:
    """A save stream of the stored image in ``spool`` with only its layers from ``below`` on (the manifest names
    them all; the ones under them, which the base release holds, are left out, as in an archive that carries
    only what an engine lacks), each layer's bytes hashed against its diffID as they are written."""
    names = [f"{layer.chain}/layer.tar" for layer in stored.layers]
    config_name = f"{stored.image_id.removeprefix('sha256:')}.json"
    with open(spool, "wb") as fh:
        fh.write(tar_header(config_name, len(stored.config)) + stored.config + tar_padding(len(stored.config)))
        for name, layer in zip(names[below:], stored.layers[below:]):
            digest = hashlib.sha256()
            size = 0
            for piece in layer_tar(layer, lambda length: fh.write(tar_header(name, length))):
                digest.update(piece)
                size += len(piece)
                fh.write(piece)
            fh.write(tar_padding(size))
            if f"sha256:{digest.hexdigest()}" != layer.diff_id:
                raise StoreMismatch(f"layer {layer.diff_id}'s bytes hash to sha256:{digest.hexdigest()}")
        index = json.dumps([{"Config": config_name, "RepoTags": [], "Layers": names}]).encode()
        fh.write(tar_header("manifest.json", len(index)) + index + tar_padding(len(index)) + bytes(2 * BLOCK))


def assembled_source(assembly: Assembly, base: HotfixBase, small: SmallSave, tag: str,
                     held: Held | None = None) -> SaveSource:
    """What the export reads for the hotfix's image: the save stream the whole build would give
    (:func:`assembled_stream`), with the base release's bottom layers named in it: read from its
    archive (only hashed and walked, never compressed), or with ``held`` carried by name alone."""
    stream = assembled_stream(assembly, base, small, tag, held)
    if held is None:
        return SaveSource(stream=stream, shared=frozenset(
            f"blobs/sha256/{d.removeprefix('sha256:')}" for d in base.manifest.diff_ids[:assembly.lower_layers]))
    return SaveSource(stream=stream, held={layer: (place, diff_id, size) for layer, place, diff_id, size, _ in held.layers})


def assembled_stream(assembly: Assembly, base: HotfixBase, small: SmallSave, tag: str,
                     held: Held | None = None) -> Iterator[bytes]:
    """The save stream of the hotfix's image as the whole build would give it (``tag`` in its manifest):
    the base release's bottom layers (read from its archive; with ``held``, named but not carried), the
    small image's top layers, the config assembled. ``small``'s spool is removed as it ends."""
    manifest = base.manifest
    bottom = tuple(manifest.diff_ids[:assembly.lower_layers])
    names = [f"blobs/sha256/{d.removeprefix('sha256:')}" for d in bottom] if held is None else \
        [name for name, *_ in held.layers]
    config_name = f"blobs/sha256/{manifest.image_id.removeprefix('sha256:')}"
    try:
        if held is None:
            captured: dict[str, bytes] = {}
            wanted = frozenset(names)
            yield from filter_members(read_archive(base.folder, base.archive_files),
                                      lambda n: PASS if n in wanted else CAPTURE if n == config_name else DROP,
                                      strict="the base release's archive", captured=captured,
                                      capture_limit=CONFIG_LIMIT)
            # (a bottom layer the archive lacks fails the export, whose manifest names it; the config, here)
            raw = captured.get(config_name)
        else:
            raw = held.config
        if raw is None or f"sha256:{hashlib.sha256(raw).hexdigest()}" != manifest.image_id:
            raise VerificationError(f"release {manifest.release}'s archive does not hold its config "
                                    f"{manifest.image_id[:19]}")
        try:  # (the config proves its ID, but a release folder under --out is anyone's: its config too)
            history = list(json.loads(raw).get("history") or [])
            if not all(isinstance(h, dict) for h in history):
                raise TypeError("a history entry is not an object")
        except (ValueError, TypeError, AttributeError, RecursionError):
            raise VerificationError(f"release {manifest.release}'s config {manifest.image_id[:19]} is not an "
                                    "image config") from None
        bottom_history = history[:len(assembly.lower_history)]
        if [h.get("created_by", "") for h in bottom_history] != list(assembly.lower_history):
            raise VerificationError(f"release {manifest.release}'s history of the steps above the build memo's "
                                    "marker is not the memo image's: " + WHOLE)
        at = assembly.checks_at
        if at >= len(history) or history[at].get("created_by") != assembly.checks_created_by \
                or not history[at].get("empty_layer"):
            raise VerificationError(f"release {manifest.release}'s in-image checks are not recorded as a step that "
                                    "changed nothing: " + WHOLE)
        top = small.layers[assembly.below:]
        yield from _layer_members(small.path, top)
        config = copy.deepcopy(small.config)
        stamp = history[at].get("created", "")
        config["history"] = bottom_history + list(small.config.get("history") or [])[len(bottom_history):]
        config["history"].insert(at, {"created": stamp, "created_by": assembly.checks_created_by, "empty_layer": True})
        config["rootfs"] = {"type": "layers", "diff_ids": [*bottom, *small.diff_ids[assembly.below:]]}
        data = json.dumps(config).encode()
        name = f"{hashlib.sha256(data).hexdigest()}.json"
        layers = [*names, *(f"top{n}/layer.tar" for n in range(len(top)))]
        index = json.dumps([{"Config": name, "RepoTags": [tag], "Layers": layers}]).encode()
        for member, content in ((name, data), ("manifest.json", index)):
            yield tar_header(member, len(content)) + content + tar_padding(len(content))
        yield bytes(2 * BLOCK)
    finally:
        small.path.unlink(missing_ok=True)


def _layer_members(spool: Path, names: Iterable[str]) -> Iterator[bytes]:
    """The layers ``names`` of a spooled save stream, as members ``top0/layer.tar``, ``top1/layer.tar``, ..."""
    with tarfile.open(spool, "r:") as saved:
        for n, name in enumerate(names):
            member = saved.getmember(name)
            reader = saved.extractfile(member)
            if reader is None:
                raise ArchiveError(f"the small image's layer {name} is no file")
            yield tar_header(f"top{n}/layer.tar", member.size)
            while piece := reader.read(PIECE):
                yield piece
            yield tar_padding(member.size)


def check_early(engine: Engine, assembly: Assembly, base: HotfixBase, small: SmallSave) -> None:
    """The in-image checks, run beside the export: on an image of the same files and settings loaded
    into the local engine at once (the base release's bottom layers, which the engine holds, and the
    small image's top layers, not yet normalised: the checks read files' contents, not their times),
    removed again after. The released image differs from it only in file times and its history.
    A small image built on the memo's image (``assembly.on_memo``) holds those files itself: the checks
    run in a container of it, nothing loaded. ``small``'s spool is removed as it ends."""
    image = None
    try:
        if assembly.on_memo:
            run_checks(engine, assembly.small, assembly)
            return
        bottom = list(base.manifest.diff_ids[:assembly.lower_layers])
        diff_ids = (*bottom, *small.diff_ids[assembly.below:])
        config = dict(small.config, history=[], rootfs={"type": "layers", "diff_ids": list(diff_ids)})
        data = json.dumps(config).encode()
        image = f"sha256:{hashlib.sha256(data).hexdigest()}"
        top = small.layers[assembly.below:]
        names = [f"bottom{n}/layer.tar" for n in range(len(bottom))] + [f"top{n}/layer.tar" for n in range(len(top))]
        index = json.dumps([{"Config": f"{image[7:]}.json", "RepoTags": [], "Layers": names}]).encode()

        def stream() -> Iterator[bytes]:  # the bottom layers' files left out: the engine holds them
            yield from _layer_members(small.path, top)
            for member, content in ((f"{image[7:]}.json", data), ("manifest.json", index)):
                yield tar_header(member, len(content)) + content + tar_padding(len(content))
            yield bytes(2 * BLOCK)

        engine.load(stream())
        found = engine.inspect_image(image)
        if found is None or tuple(found.diff_ids) != diff_ids:
            raise EngineError(f"the image the in-image checks run on did not load as {image[:19]}")
        run_checks(engine, image, assembly)
    finally:
        small.path.unlink(missing_ok=True)
        if image is not None:
            engine.remove_image(image)


def run_checks(engine: Engine, tag: str, assembly: Assembly) -> None:
    """The in-image checks of every profile, as a container of the assembled image: they must pass and
    change nothing (the whole build runs them as a step that records no layer)."""
    outcome = engine.run(tag, [assembly.checks], entrypoint=list(assembly.shell), changes=True, timeout=3600)
    lines = tuple(outcome.output.splitlines())
    if outcome.exit_code != 0:
        checks = [m.group(0) for line in lines for m in [CHECK_ERROR_RE.search(line)] if m]
        said = checks[0].removeprefix("error: ") if checks else f"exit {outcome.exit_code}: {' '.join(lines[-3:])}"
        raise CheckFailed(f"in-image check failed on the assembled hotfix, so it was not released: {said}",
                          output=lines)
    if outcome.changes:
        shown = ", ".join(outcome.changes[:5]) + (" ..." if len(outcome.changes) > 5 else "")
        raise VerificationError(f"the in-image checks changed the assembled hotfix ({shown}): the whole build records "
                                "that as a layer, so the hotfix would not be the image it gives; make it with "
                                "--full-build")


