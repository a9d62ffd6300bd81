"""Overlay over sglang/srt/sampling/sampling_batch_info.py (unibake-overlay: sampling_batch_info).

A placeholder hotfix: a tiny positive floor on the temperature, so that a client sending 0.0 to a
layout with sampling kernels that divide by it gets greedy decoding instead of NaNs.
"""

from __future__ import annotations

MIN_TEMPERATURE = 1e-5


def clamp_temperature(value: float) -> float:
    return max(value, MIN_TEMPERATURE)
