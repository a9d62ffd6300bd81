"""Stage 3: build the rendered context on the engine; the in-image checks run as a build step.

A check that fails fails the build, so a bad image never gets a tag.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from .engine import BuildStep, Engine
from .errors import BuildFailed, CheckFailed, EngineError
from .render import BuildContext, write_context_tar

CHECK_ERROR_RE = re.compile(r"error: self-check\[[^\]]+\]: .*")


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    """An image the engine holds under ``tag``, with what it reported about it."""

    image_id: str
    tag: str
    diff_ids: tuple[str, ...]
    labels: dict[str, str]
    size: int
    steps: tuple[BuildStep, ...]
    seconds: float

    @property
    def cacheable_steps(self) -> tuple[BuildStep, ...]:
        """Every step but FROM, which the engine never reports as cached."""
        return tuple(s for s in self.steps if not s.instruction.startswith("FROM "))

    @property
    def cached_steps(self) -> int:
        return sum(1 for s in self.steps if s.cached)


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_image(context: BuildContext, engine: Engine, *, revision: str, epoch: int, nocache: bool = False,
                on_line: Callable[[str], None] = lambda line: None) -> BuiltImage:
    """Build ``context`` and tag it; raises CheckFailed when an in-image check fails."""
    start = time.monotonic()
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as tar:
        write_context_tar(context, tar, mtime=epoch)
        tar.seek(0)
        try:
            outcome = engine.build(tar, tag=context.tag, nocache=nocache, on_line=on_line,
                                   buildargs={"UNIBAKE_REVISION": revision, "UNIBAKE_CREATED": iso_time(epoch)})
        except BuildFailed as exc:
            checks = [m.group(0) for line in exc.output for m in [CHECK_ERROR_RE.search(line)] if m]
            if checks:
                raise CheckFailed(f"in-image check failed during the build, so {context.tag} was not tagged: "
                                  f"{checks[0].removeprefix('error: ')}", output=exc.output) from None
            raise
    info = engine.inspect_image(context.tag)
    if info is None or info.id != outcome.image_id:
        raise EngineError(f"the build finished but {context.tag} does not point at {outcome.image_id}")
    return BuiltImage(image_id=info.id, tag=context.tag, diff_ids=info.diff_ids, labels=info.labels,
                      size=info.size, steps=outcome.steps, seconds=time.monotonic() - start)
