"""``build.py repro``: build twice from cold and compare, layer by layer and file by file.

Two builds without the engine's cache, each normalised and archived as a release would be; then
the image IDs, every diffID and the sha256 of the archive each would ship are compared
(:func:`compare`, pure). When a layer differs, both copies of it are listed entry by entry
(content digest, mode, owner, time, size, link) and the entries that differ are named, like
diffoci does (:func:`diff_layer`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .engine import Engine
from .errors import VerificationError
from .imagetar import LayerLister, LayerListing, looks_like_layer, read_members

FIELDS = ("type", "mode", "uid", "gid", "mtime", "size", "content", "link")


@dataclass(frozen=True, kw_only=True)
class ReproBuild:
    """One of the two cold builds: its image and the sha256 of the archive it would ship."""

    image_id: str
    diff_ids: tuple[str, ...]
    archive_sha256: str


@dataclass(frozen=True, kw_only=True)
class LayerDiff:
    index: int
    diff_ids: tuple[str, str]
    entries: tuple[tuple[str, str], ...]  # (path, what differs)


@dataclass(frozen=True, kw_only=True)
class ReproReport:
    tag: str
    first: ReproBuild
    second: ReproBuild
    layer: LayerDiff | None = None  # the first layer that differs, entry by entry

    @property
    def reproducible(self) -> bool:
        return self.first.image_id == self.second.image_id and \
            self.first.archive_sha256 == self.second.archive_sha256

    @property
    def differing_layers(self) -> list[int]:
        """Each place whose layers differ, one build's missing layer included (a build of more layers)."""
        return [i for i, (x, y) in enumerate(itertools.zip_longest(self.first.diff_ids, self.second.diff_ids))
                if x != y]

    def rows(self) -> list[list[str]]:
        a, b = self.first, self.second
        rows = [["image ID", a.image_id, b.image_id, _same(a.image_id, b.image_id)]]
        rows += [[f"layer {i + 1}", x, y, _same(x, y)]
                 for i, (x, y) in enumerate(itertools.zip_longest(a.diff_ids, b.diff_ids, fillvalue="(none)"))]
        rows.append(["archive sha256", a.archive_sha256, b.archive_sha256, _same(a.archive_sha256, b.archive_sha256)])
        return rows

    def document(self) -> dict:
        return {"tag": self.tag, "reproducible": self.reproducible,
                "builds": [{"image_id": x.image_id, "diff_ids": list(x.diff_ids), "archive_sha256": x.archive_sha256}
                           for x in (self.first, self.second)],
                "layer": None if self.layer is None else {
                    "index": self.layer.index + 1, "diff_ids": list(self.layer.diff_ids),
                    "entries": [{"path": p, "difference": d} for p, d in self.layer.entries]}}

    def raise_if_different(self) -> None:
        if self.reproducible:
            return
        a, b = self.first, self.second
        if a.image_id == b.image_id:  # the same image, written to two archives of other bytes
            raise VerificationError(f"the builds are the same image ({a.image_id}), but its archives differ "
                                    f"(sha256 {a.archive_sha256} against {b.archive_sha256}): the archive is not "
                                    "written alike from one image")
        if len(a.diff_ids) != len(b.diff_ids):
            count = len(a.diff_ids)
            raise VerificationError(f"not reproducible: the first build has {count} layer{'s' * (count != 1)}, the "
                                    f"second {len(b.diff_ids)}" + (f"; layer {self.differing_layers[0] + 1} is the first that "
                                                            "differs" if self.differing_layers else ""))
        if not self.differing_layers:
            raise VerificationError(f"the builds differ only in their config ({a.image_id} against "
                                    f"{b.image_id}): labels, environment or history")
        diff = self.layer
        assert diff is not None
        first = diff.entries[0] if diff.entries else ("(no entry)", "the layer tars differ in order or padding")
        raise VerificationError(f"not reproducible: layer {diff.index + 1} differs ({len(diff.entries)} entries), "
                                f"first {first[0]}: {first[1]}")


def _same(x: str, y: str) -> str:
    return "same" if x == y else "DIFFERENT"


def list_layer(engine: Engine, image: str, diff_id: str) -> LayerListing:
    """Every entry of the layer ``diff_id`` of ``image``, with the digest of its content; one save."""
    members = read_members(engine.save(image),
                           route=lambda name, size, head: LayerLister(diff_id) if looks_like_layer(name, head) else None)
    listing = next((m.routed for m in members.values() if m.routed is not None), None)
    if listing is None:
        raise VerificationError(f"{image} has no layer {diff_id}")
    return listing


def compare_listings(a: LayerListing, b: LayerListing) -> list[tuple[str, str]]:
    out = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            out.append((path, "only in the second build"))
        elif path not in b:
            out.append((path, "only in the first build"))
        elif a[path] != b[path]:
            what = [f"{f} {x!r} -> {y!r}" for f, x, y in zip(FIELDS, a[path], b[path]) if x != y]
            out.append((path, ", ".join(what)))
    return out


def diff_layer(engine: Engine, first: str, second: str, index: int, diff_ids: tuple[str, str]) -> LayerDiff:
    a = list_layer(engine, first, diff_ids[0])
    b = list_layer(engine, second, diff_ids[1])
    return LayerDiff(index=index, diff_ids=diff_ids, entries=tuple(compare_listings(a, b)))


def compare(engine: Engine, tag: str, first: ReproBuild, second: ReproBuild) -> ReproReport:
    """The two builds compared; the first differing layer listed entry by entry."""
    report = ReproReport(tag=tag, first=first, second=second)
    if report.reproducible or not report.differing_layers:
        return report
    i = report.differing_layers[0]
    if i >= min(len(first.diff_ids), len(second.diff_ids)):  # one build's extra layer: nothing to list it against
        return report
    layer = diff_layer(engine, first.image_id, second.image_id, i, (first.diff_ids[i], second.diff_ids[i]))
    return ReproReport(tag=tag, first=first, second=second, layer=layer)
