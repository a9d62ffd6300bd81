"""Hotfix releases: what a release that ships only the layers that changed needs of its base.

A hotfix is built from the same profiles with the base release's ``SOURCE_DATE_EPOCH``, so every
layer below the first change is identical to the one the base shipped; its archive leaves those
layers out, and its round trip loads the base release first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from .builder import MAX_EPOCH
from .errors import InputError, VerificationError
from .manifest import DEFAULT_PLATFORM, TAG_PATTERN, ReleaseManifest, load_manifest
from .publish import find_releases, release_tag, repository

TAG_RE = re.compile(TAG_PATTERN)


@dataclass(frozen=True, kw_only=True)
class HotfixBase:
    """The published release a hotfix builds on."""

    folder: Path
    manifest: ReleaseManifest

    @property
    def epoch(self) -> int:
        assert self.manifest.source_date_epoch is not None  # load_base refuses a release without one
        return self.manifest.source_date_epoch

    @property
    def archive_files(self) -> list[str]:
        return [f.name for f in self.manifest.archive.files]

    def missing_files(self) -> list[str]:
        return [n for n in self.archive_files if not (self.folder / n).is_file()]


def base_folder_name(name: str) -> str:
    """``--from`` takes a release folder's name (1.3.1) or an image reference with its tag (demo-llm:1.3.1);
    anything else gives a name no release folder has. A reference whose last ``:`` is not its tag's
    (``demo-llm:../../x``, ``host:5000/demo-llm``) was read as ``latest``, the tag a reference without one
    means: such a ``--from`` took the release a ``latest`` link under ``--out`` names."""
    if ":" not in name:
        return name
    if "/" in name.rsplit(":", 1)[1]:
        return name  # (refused by the caller, naming it: not a release folder's name)
    return release_tag(name)


def _such_as(out: Path) -> str:
    """For an error: a release under ``out`` as --from takes it (its folder's name or its tag), not
    the demo product's."""
    try:
        names = sorted(p.name for p in out.iterdir() if TAG_RE.fullmatch(p.name) and (p / "manifest.json").is_file())
    except OSError:
        names = []
    for release in reversed(names):
        try:
            return f", such as {release}, nor its image's tag ({load_manifest(out / release, InputError).tag})"
        except InputError:
            continue
    return " (it holds none), nor a release's image tag (PRODUCT:VERSION)"


def load_base(out: Path, name: str, *, hold: Callable[[str], object] = lambda release: None) -> HotfixBase:
    """The release ``--from`` names, under ``out``; refused (exit 2) when it cannot be a base.
    ``hold`` is called with the release's name before its folder is read (its lock is taken)."""
    release = base_folder_name(name.rstrip("/"))
    if not TAG_RE.fullmatch(release):  # a path (../other/1.0, /abs/1.0) would make a hotfix whose base is not under
        # --out: releases, push, prune and --force look for the base beside the hotfix, by its name
        raise InputError(f"--from {name!r}: not the name of a release folder under --out ({out}){_such_as(out)}; copy "
                         "a release made elsewhere under --out first")
    folder = out / release
    if not (folder / "manifest.json").exists():
        raise InputError(f"--from {name}: {folder / 'manifest.json'} does not exist; name a published release")
    hold(release)
    # against its SHA256SUMS first, the bytes hashed being the bytes parsed: a base that does not verify is exit 3,
    # as the README says (a manifest.json that was a link, or not JSON, was exit 2, one re-summed then exit 3)
    from .verify import trusted_manifest

    try:
        manifest = trusted_manifest(folder)
    except VerificationError as exc:
        said = str(exc).removeprefix(f"{folder}/").replace("manifest.json: ", "manifest.json ", 1)
        said = said.removesuffix("; the folder cannot be trusted")
        raise VerificationError(f"the base release {folder}: {said}; a hotfix is made on a release that verifies "
                                f"(python build.py verify {folder})") from None
    if ":" in name and repository(name.rstrip("/")) != repository(manifest.tag):
        # the folder is named by the tag alone: other:1.0 would take this product's 1.0 without a word
        raise InputError(f"--from {name}: {folder} is the release of {manifest.tag}, not of {repository(name)}: "
                         f"release folders are named by version, so {name} names no release under --out ({out})")
    if manifest.source_date_epoch is None:
        raise InputError(f"--from {name}: that release records no SOURCE_DATE_EPOCH (made before normalising "
                         "existed); a hotfix needs it to rebuild identical layers")
    if manifest.source_date_epoch > MAX_EPOCH:  # (the manifest's own bound is the year 9999's: a JSON time's)
        raise VerificationError(f"the base release {folder}: its manifest.json records SOURCE_DATE_EPOCH "
                                f"{manifest.source_date_epoch}, past what a tar header holds ({MAX_EPOCH}), which no "
                                "release unibake made records: a hotfix on it would write layers no engine reads alike")
    if manifest.hotfix is not None:
        # its archive lacks the layers its own base shipped: the round trip, apply.sh and push would each
        # need the whole chain of folders; a hotfix is made on a full release
        raise InputError(f"--from {name}: release {manifest.release} is itself a hotfix on "
                         f"{manifest.hotfix.base_release}; make the hotfix on a full release (--from "
                         f"{manifest.hotfix.base_release}, or a full release of {manifest.release}'s inputs)")
    return HotfixBase(folder=folder, manifest=manifest)


def omitted_layers(base_diff_ids: tuple[str, ...], diff_ids: tuple[str, ...]) -> tuple[str, ...]:
    """The layers a hotfix leaves out: the longest run, from the bottom, shared with the base release.

    An engine reuses a layer it has only when everything below it is the same too (its chain ID),
    so a layer above the first changed one ships again even when its content did not change. The archive
    holds one blob per diffID: a layer of the run that the image has again above it (the same content: an
    empty layer, a file written back) ships, so the run stops below it (the verifiers take left-out layers
    only as a bottom run).
    """
    shared = 0
    for mine, theirs in zip(diff_ids, base_diff_ids):
        if mine != theirs:
            break
        shared += 1
    while shared and not set(diff_ids[:shared]).isdisjoint(diff_ids[shared:]):
        shared -= 1
    return tuple(diff_ids[:shared])


def earlier_releases(out: Path, *, product: str, platform: str, profiles: Collection[str],
                     release: str) -> list[ReleaseManifest]:
    """The releases under ``out`` that ``build`` without ``--from`` may make its release on, newest published first:
    full releases (no hotfix; the archive one file, as frames are lent from one) of ``product`` for ``platform``
    and the same selection of ``profiles`` (the in-image checks of another selection are another step: a release of
    tp1 never assembles one of tp4) that record a SOURCE_DATE_EPOCH, other than ``release`` itself (the one a
    --force run replaces). Those at the run's epoch hold its layers of the same inputs, so made on one of them, as
    --from does, the release is the same bytes. Read as found: the one taken is then loaded as --from loads it,
    against its SHA256SUMS. A link (``latest``), a folder whose manifest does not parse or names another release,
    and one without its archive (a fresh clone's: archives are not tracked) are passed over."""
    found = [r.manifest for r in find_releases(out)
             if r.manifest is not None and not r.folder.is_symlink() and r.folder.name == r.manifest.release]
    return [m for m in sorted(found, key=lambda m: (m.published, m.release), reverse=True)
            if m.release != release and m.product == product and (m.platform or DEFAULT_PLATFORM) == platform
            and set(m.profiles) == set(profiles)
            and m.source_date_epoch is not None and m.hotfix is None and len(m.archive.files) == 1
            and (out / m.release / m.archive.files[0].name).is_file()]
