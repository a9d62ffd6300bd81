"""Read the profile's autotune caches (JSON); the engine refuses to start if any is missing."""

from __future__ import annotations

import json
import os

from .kernels import StartupError


def load_tune_caches(folder: str, expect: str) -> dict[str, dict]:
    """Every ``*.json`` in ``folder``, parsed; the count must equal ``expect`` when it is set."""
    if not folder or not os.path.isdir(folder):
        raise StartupError(f"tune-cache folder {folder or '(unset)'} is missing")
    caches = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    caches[name] = json.load(fh)
            except (OSError, ValueError) as exc:
                raise StartupError(f"tune cache {path} is unreadable: {exc}") from None
    if expect and len(caches) != int(expect):
        raise StartupError(f"expected {expect} tune caches in {folder}, found {len(caches)}")
    return caches
