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
from .manifest import MANIFEST, load_manifest
from .publish import release_tag

REPRO_REPOSITORY = "unibake-repro"


def repro_ref(product: str, hold: str) -> str:
    """The tag a repro build is made under: never a release's."""
    return f"{REPRO_REPOSITORY}/{product}:{hold}"


def refuse_moving_a_released_tag(out: Path, tag: str, *, force: bool) -> None:
    """InputError when ``tag`` has a release folder under ``out`` and ``force`` is not given."""
    folder = out / release_tag(tag)
    if force or not os.path.lexists(folder / MANIFEST):
        return
    try:
        image = f"image {load_manifest(folder).image_id}"
    except VerificationError:
        image = "its manifest.json unreadable"
    raise InputError(f"{tag} is released ({folder}, {image}): a released tag never moves to another image, so "
                     f"that IMAGE={tag} ./run.sh stays a roll-back; build a new --version, or give --force to "
                     "replace that release")
