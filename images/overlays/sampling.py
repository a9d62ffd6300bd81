"""Overlay patched over demo_engine/sampling.py: the product's reply format.

The reply names the profile and the kernels the engine actually loaded, so a smoke gate that
expects UNIFIED_TP2_OK also proves the TP2 layout (and its sidecar) is the one that answered.
"""

from __future__ import annotations


def generate(state, messages: list[dict]) -> str:
    kernels = " ".join(k.info for k in state.kernels)
    return (f"UNIFIED_{state.profile.upper()}_OK model={state.model_name} tp={state.tp} "
            f"kernels=[{kernels}] tune_caches={len(state.tune_caches)} score={state.warmup_score:.4f}")
