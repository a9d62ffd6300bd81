"""What the benchmark made in the engine, found by comparing with what was there before, and removed.

The benchmark removes the tags and dangling images that appeared since its snapshot: what it made, on an
engine it has to itself while it runs (bench.py says so; nothing here can tell another user's image
made meanwhile from its own).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    tags: frozenset[str]
    dangling: frozenset[str]


def snapshot(engine) -> Snapshot:
    """The engine's tags and dangling images now."""
    return Snapshot(tags=frozenset(t for i in engine.list_images() for t in i.tags),
                    dangling=frozenset(i.id for i in engine.list_images(dangling=True)))


def restore(engine, before: Snapshot) -> list[str]:
    """Remove every tag and dangling image that appeared since ``before``, newest first (a child before
    the image it was built on); returns what could not be removed (empty when the engine is as found)."""
    images = engine.list_images()
    new = [(i.created, t) for i in images for t in i.tags if t not in before.tags]
    for _, tag in sorted(new, reverse=True):
        engine.remove_image(tag)
    for _ in range(5):  # removing a child can leave the image it was built on dangling
        dangling = [i for i in engine.list_images(dangling=True) if i.id not in before.dangling]
        if not dangling:
            break
        for image in sorted(dangling, key=lambda i: i.created, reverse=True):
            engine.remove_image(image.id)
    after = snapshot(engine)
    return sorted(after.tags - before.tags) + sorted(after.dangling - before.dangling)
