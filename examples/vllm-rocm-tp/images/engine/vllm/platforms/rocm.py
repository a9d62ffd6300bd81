"""Placeholder for the upstream vllm/platforms/rocm.py (replaced by an overlay)."""

from __future__ import annotations

# GPU architecture names the upstream ROCm platform recognises.
SUPPORTED_ARCHS = ("gfx90a", "gfx942")


def is_supported(arch: str) -> bool:
    return arch.split(":", 1)[0] in SUPPORTED_ARCHS
