"""Placeholder for the fork's sglang/srt/sampling/sampling_batch_info.py (replaced by an overlay)."""

from __future__ import annotations


def clamp_temperature(value: float) -> float:
    """Sampling temperature as the fork ships it: zero means greedy."""
    return max(value, 0.0)
