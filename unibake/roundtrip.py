"""The round trip: load the archive, as the released image, into an engine that never saw it.

Loading into the engine that built the image would prove nothing: it skips the layers it already
has. The engine is a scratch dockerd (:mod:`unibake.scratch`) or one named by ``--verify-engine``;
the load is fed by the same read of the archive that takes its digests
(:func:`unibake.archive_reader.read_back`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .archive import Archive
from .archive_reader import ReadBack, read_archive, read_back
from .engine import Engine, ImageSummary, LoadOutcome
from .errors import UnibakeError, VerificationError
from .imagetar import full_reference
from .manifest import RoundTripRecord
from .threads import counted


def round_trip(archive: Archive, engine: Engine, *, base: tuple[Path, list[str], str, str] | None = None,
               progress: Callable[[int], object] = lambda n: None,
               base_progress: Callable[[int], object] = lambda n: None) -> tuple[RoundTripRecord, ReadBack]:
    """Load the archive (decompressed here: Engine 20.10 cannot read zstd) into ``engine``, which must
    never have seen the image, in the same read that checks the archive; then compare what loaded.
    A hotfix needs the release it builds on: ``base`` (its folder, archive files, image ID and tag) is
    loaded first (its decoded bytes told to ``base_progress``: a whole release), and must give that
    image, tagged with that tag alone."""
    image_id, tag = archive.image.image_id, archive.tag
    if engine.inspect_image(image_id) is not None:
        raise VerificationError(f"the verify engine at {engine.address} already holds {image_id}: a load "
                                "there proves nothing; remove the image from it or use the scratch engine")
    if base is not None:
        folder, files, base_id, base_tag = base
        before = engine.list_images()
        loaded = engine.load(counted(read_archive(folder, files), base_progress))
        check_base_loaded(engine, folder, base_id, before=before, loaded=loaded, base_tag=base_tag)
    back = read_back(archive, load=engine.load, omitted=frozenset(archive.omitted), progress=progress)
    loaded = engine.inspect_image(image_id)
    if loaded is None:
        said = "; ".join(back.loaded.messages[-3:]) if back.loaded else "nothing"
        raise VerificationError(f"after the load, the engine has no image {image_id} (it said: {said})")
    if tuple(loaded.diff_ids) != tuple(archive.image.diff_ids):
        raise VerificationError(f"the loaded image's diffIDs differ from the archive's: {loaded.diff_ids} "
                                f"against {archive.image.diff_ids}")
    tagged = engine.inspect_image(tag)
    if tagged is None or tagged.id != image_id:
        raise VerificationError(f"after the load, {tag} does not name {image_id}")
    return RoundTripRecord(engine=engine.address, engine_version=engine.version(), image_id=loaded.id,
                           diff_ids=loaded.diff_ids, tags=back.loaded.tags if back.loaded else (),
                           seconds=round(back.seconds, 3)), back


def check_base_loaded(engine: Engine, folder: Path, base_id: str, *, before: list[ImageSummary] | None = None,
                      loaded: LoadOutcome | None = None, base_tag: str | None = None) -> None:
    """A hotfix's base release, loaded from its folder's archive, must be the image its manifest
    records: another archive there (another product's, with SHA256SUMS rewritten to match) would
    otherwise pass for it, and the hotfix's proof would name a base it never loaded on. What that load
    brought (``loaded``; the engine's images ``before`` it) is then taken out of the engine again: a
    --verify-engine kept the other image and its tag. ``base_tag``: the base release's own, the one tag its
    archive may put on its image (another, moved from an image of the engine's, would stay on it)."""
    if engine.inspect_image(base_id) is None:
        left = undo_load(engine, before, loaded) if before is not None and loaded is not None else ""
        raise VerificationError(f"the base release {folder}: its archive did not load as the image "
                                f"{base_id} that its manifest.json records: it holds another image; check it "
                                f"with: python build.py verify {folder}{left}")
    if before is None or loaded is None:
        return
    # a release's archive holds its one image: another one beside it (a tag of the engine's moved to it) is forged
    extra = []
    for tag in loaded.tags:
        info = engine.inspect_image(tag)
        if info is not None and info.id != base_id:
            extra.append(f"{tag} ({info.id[:19]})")
    extra += [i for i in loaded.image_ids if i != base_id]
    if extra:
        left = undo_load(engine, before, loaded)
        raise VerificationError(f"the base release {folder}: its archive loaded another image beside the image "
                                f"{base_id} that its manifest.json records: {extra[0]}; check it with: python "
                                f"build.py verify {folder}{left}")
    if base_tag is None:
        return
    # and its one tag: a release's archive tags its image with its release's tag alone
    others = [t for t in loaded.tags if full_reference(t) != full_reference(base_tag)]
    if others:
        left = undo_load(engine, before, loaded)
        raise VerificationError(f"the base release {folder}: its archive put a tag on the image {base_id} other "
                                f"than its release's {base_tag}: {others[0]}; check it with: python build.py verify "
                                f"{folder}{left}")


def undo_load(engine: Engine, before: list[ImageSummary], loaded: LoadOutcome) -> str:
    """Undo a load: each tag it put on an image goes back to the image it named before (or is removed), and each
    image the engine did not hold before is removed. Returns what could not be undone, as the end of a sentence
    ("" when all was)."""
    tags = {t: i.id for i in before for t in i.tags}
    held = {i.id for i in before}
    new, left = set(i for i in loaded.image_ids if i not in held), []
    try:
        for tag in loaded.tags:
            info = engine.inspect_image(tag)
            if info is None or tags.get(tag) == info.id:
                continue
            if info.id not in held:
                new.add(info.id)
            if tag in tags and engine.inspect_image(tags[tag]) is not None:
                engine.tag(tags[tag], tag)  # back on the image it named
            elif info.id in held and not any(t in tags for t in info.tags if t != tag):
                left.append(f"the tag {tag} it put on {info.id[:19]}, which the engine held untagged before")
            elif not engine.untag(tag):
                left.append(f"the tag {tag} (a container uses its image)")
        for image_id in sorted(new):
            if not engine.remove_if_unused(image_id):
                left.append(f"the image {image_id[:19]} (something uses it)")
    except UnibakeError as exc:
        left.append(f"what it loaded ({exc})")
    return f"; left in the engine at {engine.address}: {', '.join(left)}" if left else ""
