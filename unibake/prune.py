"""``build.py prune``: what unibake leaves in the engine over time, removed on request.

Kept: the images of the newest ``--keep`` releases of each product found under ``--out`` (by
their published time). Removed: the engine's tags of older releases (when the image's own metadata
label names that release: a folder alone cannot name an image to remove), unibake's build cache
(``unibake-cache/*``), and dangling images that carry unibake's labels. Release folders and images
unibake did not make are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .builder import CACHE_REPOSITORY
from .engine import Engine
from .errors import UnibakeError
from .metadata import PROFILES_LABEL, ImageMetadata
from .publish import find_releases


@dataclass(frozen=True, kw_only=True)
class Removal:
    ref: str
    why: str


def plan_removals(engine: Engine, out: Path, *, keep: int) -> list[Removal]:
    """What prune would remove, without removing anything."""
    removals: list[Removal] = []
    by_product: dict[str, list] = {}
    for found in find_releases(out):
        if found.manifest is not None:
            by_product.setdefault(found.manifest.product, []).append(found.manifest)
    kept: set[str] = set()
    for product, manifests in by_product.items():
        manifests.sort(key=lambda m: m.published)
        old, new = manifests[:-keep] if keep else manifests, manifests[-keep:] if keep else []
        kept.update(m.tag for m in new)
        for m in old:
            info = engine.inspect_image(m.tag)
            if info is not None and info.id == m.image_id and m.tag not in kept and _made_by_unibake(info.labels, m):
                removals.append(Removal(ref=m.tag, why=f"release {m.release} of {product}, older than the "
                                                       f"newest {keep}"))
    for image in engine.list_images():
        for tag in image.tags:
            if tag.startswith(f"{CACHE_REPOSITORY}/"):
                removals.append(Removal(ref=tag, why="build cache"))
    for image in engine.list_images(dangling=True):
        if PROFILES_LABEL in image.labels:
            removals.append(Removal(ref=image.id, why="a dangling image unibake built"))
    return removals


def _made_by_unibake(labels: dict[str, str], manifest) -> bool:
    """A folder under --out only says which image it released; the image itself must say unibake
    built it as that release (its metadata label naming the same product and tag), or it is left
    alone: a folder naming, say, postgres:15 removes nothing."""
    try:
        metadata = ImageMetadata.from_labels(labels or {}, manifest.tag)
    except UnibakeError:
        return False
    return metadata is not None and (metadata.product, metadata.tag) == (manifest.product, manifest.tag)


def prune(engine: Engine, out: Path, *, keep: int, dry_run: bool = False,
          on_line: Callable[[str], None] = lambda line: None) -> list[Removal]:
    removals = plan_removals(engine, out, keep=keep)
    for r in removals:
        on_line(f"    {'would remove' if dry_run else 'removing'} {r.ref} ({r.why})")
        if not dry_run:
            engine.remove_image(r.ref)
    return removals
