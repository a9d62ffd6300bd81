"""Overlay over vllm/platforms/rocm.py (unibake-overlay: rocm-platform).

A placeholder patch: the upstream list of supported architectures plus the names Hygon DCUs
report, so the same image serves AMD Instinct and Hygon DCU nodes.
"""

from __future__ import annotations

SUPPORTED_ARCHS = ("gfx90a", "gfx942", "gfx926", "gfx928", "gfx936")


def is_supported(arch: str) -> bool:
    return arch.split(":", 1)[0] in SUPPORTED_ARCHS
