"""Build the rendered context on the engine; the in-image checks run as a build step.

A check that fails fails the build, so a bad image never gets a tag. What the build leaves behind
that the engine would otherwise list as dangling (the builder stage's last image, the image before
it was normalised, the last good step of a failed build) is kept as labelled build cache under
``unibake-cache/<product>:<selection>-<role>``: one image per role, the one it replaces removed
unless something still needs it, and ``build.py prune`` removes them all.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from . import buildmemo
from .engine import BuildOutcome, BuildStep, Engine, ImageInfo
from .errors import BuildFailed, BuildInterrupted, CheckFailed, EngineError, UnibakeError
from .platforms import EXEC_FORMAT, emulation_hint, recorded
from .render import BuildContext, write_context_tar

CHECK_ERROR_RE = re.compile(r"error: self-check\[[^\]]+\]: .*")
KERNEL_ERROR_RE = re.compile(r"error: kernel-build\[([^\]]+)\]: (.*)")  # the line the kernel's RUN prints
CACHE_REPOSITORY = "unibake-cache"


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    """An image the engine built and tagged, with what it reported about the build."""

    image_id: str
    tag: str
    diff_ids: tuple[str, ...]
    steps: tuple[BuildStep, ...]
    stage_images: tuple[str, ...]
    seconds: float
    size: int = 0  # the engine's size of the image (its layers' content)
    replaced: str | None = None  # the image the tag named before this build, if another
    memoised: int = 0  # steps not sent to the engine: the build memo held their image
    memo_lower: str | None = None  # the build memo's image of the steps above its marker, this image's bottom
    assembled: object | None = None  # a hotfix assembled from a small build (unibake.assemble.Assembly)

    @property
    def cacheable_steps(self) -> tuple[BuildStep, ...]:
        """Every step but FROM, which is never taken from the cache (its image is the base's; the "Using cache"
        lines in a FROM step are its parent's ONBUILD triggers', not a step of this Dockerfile)."""
        return tuple(s for s in self.steps if not s.instruction.startswith("FROM "))

    @property
    def cached_steps(self) -> int:
        return sum(1 for s in self.cacheable_steps if s.cached)


@dataclass(frozen=True, kw_only=True)
class Image:
    """An image in the engine, ready to be released: what the engine says of it."""

    ref: str  # the reference it is saved by (its tag)
    image_id: str
    diff_ids: tuple[str, ...]
    labels: dict[str, str]
    size: int
    save_bytes: int = 0  # the length of its save stream, when a stage has read one
    platform: str = ""  # os/architecture its config records (linux/arm64); "" when it records none
    created: str = ""  # its config's created, as the engine reports it (RFC 3339)
    repo_digests: tuple[str, ...] = ()  # as the engine reports them (ImageInfo.repo_digests)


def image_platform(info: ImageInfo) -> str:
    """The platform an engine's image records, as ``linux/arm64``; "" when it records none."""
    return recorded(info.architecture, info.os, info.variant)


MAX_EPOCH = 8 ** 11 - 1  # what a tar header's 11 octal digits hold (the year 2242): the most SOURCE_DATE_EPOCH can be


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cache_ref(product: str, selection: str, role: str) -> str:
    """``unibake-cache/<product>:<selection>-<role>``; a long selection is shortened to a digest."""
    if len(selection) + len(role) > 100:
        selection = "sel" + hashlib.sha256(selection.encode()).hexdigest()[:16]
    return f"{CACHE_REPOSITORY}/{product}:{selection}-{role}"


def keep_as_cache(engine: Engine, ref: str, image_id: str) -> None:
    """Tag ``image_id`` as ``ref``; the image the tag named before is removed unless still needed."""
    if not image_id:
        return
    before = engine.inspect_image(ref)
    engine.tag(image_id, ref)
    after = engine.inspect_image(ref)
    if before is not None and after is not None and before.id != after.id:
        engine.remove_if_unused(before.id)


def _keep_stages(engine: Engine, product: str, selection: str, stage_images: tuple[str, ...]) -> None:
    for n, stage_image in enumerate(stage_images, 1):
        keep_as_cache(engine, cache_ref(product, selection, f"stage{n}"), stage_image)


def _hold(engine: Engine, product: str, selection: str, image_ids: tuple[str, ...], held: list[str]) -> bool:
    """Tag the build memo's images for the time of one build, so that another run of the same selection,
    whose build cache replaces (and removes) the images this one builds FROM, cannot take them away
    mid-build (an untagged image is removed; a tagged one is kept). False, with nothing left tagged, when
    one is gone already. Each tag is put in ``held`` before it is asked for, so that the caller's clean-up
    (its ``finally``) removes it even when an interrupt lands while it is put or right after. The tags are
    build cache (``unibake-cache/...``): ``prune`` removes any a killed run left."""
    token = f"hold{os.getpid()}x{secrets.token_hex(3)}"
    for n, image_id in enumerate(image_ids):
        ref = cache_ref(product, selection, f"{token}-{n}")
        held.append(ref)
        try:
            engine.tag(image_id, ref)
        except EngineError:
            if engine.inspect_image(image_id) is not None:
                raise
            _release(engine, held)
            return False
    return True


def _release(engine: Engine, held: list[str]) -> None:
    """Remove the tags :func:`_hold` put (each image stays while the build made from it, or a tag, needs it);
    ``held`` is emptied as they go."""
    while held:
        engine.untag(held[-1])
        held.pop()


def build_image(context: BuildContext, engine: Engine, *, product: str, revision: str, epoch: int,
                nocache: bool = False, on_line: Callable[[str], None] = lambda line: None,
                ref: str | None = None, platform: str | None = None, memo: Path | None = None,
                memo_key: bytes | None = None) -> BuiltImage:
    """Build ``context`` and tag it ``ref`` (default: the image's own tag); raises CheckFailed when an
    in-image check fails, BuildFailed naming the kernel when a kernel does not compile.
    ``platform``: the target, when the engine is told one (``linux/arm64``). ``memo``: the folder of
    the build memo (:mod:`unibake.buildmemo`); None: the whole Dockerfile is always built. ``memo_key``:
    the user's key of the memos' HMAC (default: :func:`unibake.buildmemo.secret` of this process's
    environment; none there: no memo)."""
    start = time.monotonic()
    tag = ref or context.tag
    before = engine.inspect_image(tag)
    if memo is not None and memo_key is None:
        memo_key = buildmemo.secret(os.environ)
    cut = buildmemo.split(context.dockerfile) if memo is not None and memo_key else None
    key = buildmemo.inputs_digest(context, cut, engine, platform) if cut is not None else None
    hit = buildmemo.lookup(memo, context.selection, platform, key, cut, engine, memo_key) \
        if key is not None and not nocache else None
    held: list[str] = []  # the hold's tags, removed by the finally however the build ends (an interrupt too)
    made_memo = None
    try:
        if hit is not None and not _hold(engine, product, context.selection, (hit.lower, *hit.stages), held):
            on_line("the build memo's images went from the engine since they were looked up (another run's build "
                    "cache replaced them): building everything")
            hit = None
        if hit is not None:
            on_line(f"the {cut.lower_steps} steps above the build memo's marker are unchanged (inputs "
                    f"sha256:{key[:12]}): building FROM {hit.lower[:19]}, without their context")
            offset = cut.lower_steps - 1  # the upper Dockerfile's FROM stands for the steps above the marker
            try:
                outcome = _build(buildmemo.upper_context(context, cut, hit), engine, tag=tag, product=product,
                                 revision=revision, epoch=epoch, nocache=False, platform=platform,
                                 on_line=lambda line: on_line(_renumbered(line, offset)))
            except BuildFailed as exc:
                raise _renumbered_failure(exc, offset) from None
    finally:
        _release(engine, held)
    if hit is not None:
        lower = [BuildStep(number=n, instruction=text, cached=not text.upper().startswith("FROM "))
                 for n, text in enumerate(buildmemo.instructions(cut.lower), 1)]
        upper = [replace(s, number=s.number - 1 + cut.lower_steps) for s in outcome.steps[1:]]  # its FROM: the memo
        outcome = replace(outcome, steps=(*lower, *upper), stage_images=hit.stages)
        memoised = sum(1 for s in lower if s.cached)  # a FROM is never a cached step, so never a memoised one
    else:
        outcome = _build(context, engine, tag=tag, product=product, revision=revision, epoch=epoch,
                         nocache=nocache, on_line=on_line, platform=platform)
        memoised = 0
        # recorded only when the FROM images are still the ones the digest named: a tag moved during the build (a
        # pull) had the engine build on the new image, which would be recorded under the old one's digest (and
        # built on whenever the tag named that old image again)
        if key is not None and buildmemo.inputs_digest(context, cut, engine, platform) == key:
            made_memo = buildmemo.record(memo, context.selection, platform, key, cut, outcome.steps,
                                        outcome.stage_images, engine, memo_key)
        elif key is not None:
            on_line("a FROM image's tag moved (or the image went) during the build: the build memo is not recorded "
                    "for it")
    _keep_stages(engine, product, context.selection, outcome.stage_images)
    info = engine.inspect_image(tag)
    if info is None or info.id != outcome.image_id:
        raise EngineError(f"the build finished but {tag} does not point at {outcome.image_id}")
    return BuiltImage(image_id=info.id, tag=tag, diff_ids=info.diff_ids, steps=outcome.steps,
                      stage_images=outcome.stage_images, seconds=time.monotonic() - start, size=info.size,
                      replaced=before.id if before is not None and before.id != info.id else None,
                      memoised=memoised, memo_lower=hit.lower if hit is not None else made_memo.lower if made_memo else None)


_STEP_LINE = re.compile(r"^Step ([0-9]+)/([0-9]+) : ")
_STEP_NAME = re.compile(r"^Step ([0-9]+): ")


def _renumbered(line: str, offset: int) -> str:
    """A build line of the upper Dockerfile with the whole Dockerfile's step numbers (``Step 5/12``
    of the memo build is ``Step 17/24`` of the file the user has)."""
    m = _STEP_LINE.match(line)
    return f"Step {int(m[1]) + offset}/{int(m[2]) + offset} : {line[m.end():]}" if m else line


def _renumbered_failure(exc: BuildFailed, offset: int) -> BuildFailed:
    """The same failure, its step named with the whole Dockerfile's number."""
    m = _STEP_NAME.match(exc.step)
    if m is None:  # a failed check or kernel, or before the first step: no number to change
        return exc
    step = f"Step {int(m[1]) + offset}: {exc.step[m.end():]}"
    return BuildFailed(str(exc).replace(exc.step, step, 1), step=step, output=exc.output, last_image=exc.last_image,
                       stage_images=exc.stage_images)


def _build(context: BuildContext, engine: Engine, *, tag: str, product: str, revision: str, epoch: int,
           nocache: bool, on_line: Callable[[str], None], platform: str | None) -> BuildOutcome:
    """One build on the engine; its failures named (a failed check, a kernel that did not compile)."""
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as tar:
        write_context_tar(context, tar, mtime=epoch)
        tar.seek(0)
        try:
            return engine.build(tar, tag=tag, nocache=nocache, on_line=on_line, platform=platform,
                                buildargs={"UNIBAKE_REVISION": revision, "UNIBAKE_CREATED": iso_time(epoch)})
        except BuildInterrupted as exc:  # what finished stays as build cache, named, not dangling
            try:
                _keep_stages(engine, product, context.selection, exc.stage_images)
                if exc.last_image:
                    keep_as_cache(engine, cache_ref(product, context.selection, "failed"), exc.last_image)
            except UnibakeError as err:  # the engine going down with us: the interrupt is what to report
                on_line(f"warning: the interrupted build's finished steps were not kept as cache: {err}")
            raise
        except BuildFailed as exc:
            _keep_stages(engine, product, context.selection, exc.stage_images)
            keep_as_cache(engine, cache_ref(product, context.selection, "failed"), exc.last_image)
            checks = [m.group(0) for line in exc.output for m in [CHECK_ERROR_RE.search(line)] if m]
            if checks:
                raise CheckFailed(f"in-image check failed during the build, so {tag} was not tagged: "
                                  f"{checks[0].removeprefix('error: ')}", output=exc.output) from None
            if platform and any(EXEC_FORMAT in text for text in (str(exc), *exc.output)):
                raise BuildFailed(f"{exc}; {emulation_hint(platform)}", step=exc.step, output=exc.output,
                                  last_image=exc.last_image, stage_images=exc.stage_images) from None
            kernel = next((m for line in exc.output for m in [KERNEL_ERROR_RE.search(line)] if m), None)
            if kernel:
                raise BuildFailed(f"kernel {kernel.group(1)} failed to build, so {tag} was not tagged: "
                                  f"{kernel.group(2).strip()[:400]}", step=f"kernel {kernel.group(1)}",
                                  output=exc.output, last_image=exc.last_image,
                                  stage_images=exc.stage_images) from None
            raise
