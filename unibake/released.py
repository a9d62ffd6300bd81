"""Released tags never move.

A release folder records the image a tag named when it was published; its notes and every later
release's roll-back command (``IMAGE=product:tag ./run.sh``) rely on the tag still naming that
image. So a build under a tag that has a release folder under ``--out`` is refused before it starts
(exit 2) unless ``--force`` replaces that release; ``repro`` builds under its own tags.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError, VerificationError
from .manifest import MANIFEST, ReleaseManifest, load_manifest
from .publish import release_tag

REPRO_REPOSITORY = "unibake-repro"


def repro_ref(product: str, hold: str) -> str:
    """The tag a repro build is made under: never a release's."""
    return f"{REPRO_REPOSITORY}/{product}:{hold}"


def refuse_another_release(folder: Path, tag: str) -> ReleaseManifest | None:
    """InputError when ``folder`` holds the release of another image than ``tag``: folders are named
    by version, so another product's release of the same version is not this one's to move, and
    --force would replace it without a word. An unreadable manifest names no other image. Returns
    the manifest the folder holds (None: none, or unreadable)."""
    if not os.path.lexists(folder / MANIFEST):
        return None
    try:
        held = load_manifest(folder)
    except VerificationError:
        return None
    if held.tag != tag:
        raise InputError(f"{folder} holds the release of {held.tag} (product {held.product}), not {tag}: release "
                         "folders are named by version, so each product needs its own --out (e.g. --out "
                         f"release/{tag.rsplit('/', 1)[-1].split(':', 1)[0]}); nothing was replaced")
    return held


def refuse_moving_a_released_tag(out: Path, tag: str, *, force: bool) -> None:
    """InputError when ``tag`` has a release folder under ``out`` and ``force`` is not given (or when
    that folder is another image's release, whatever ``force``)."""
    folder = out / release_tag(tag)
    held = refuse_another_release(folder, tag)
    if force or not os.path.lexists(folder / MANIFEST):
        return
    image = f"image {held.image_id}" if held is not None else "its manifest.json unreadable"
    raise InputError(f"{tag} is released ({folder}, {image}): a released tag never moves to another image, so "
                     f"that IMAGE={tag} ./run.sh stays a roll-back; build a new --version, or give --force to "
                     "replace that release")
