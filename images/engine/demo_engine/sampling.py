"""Turn a chat request into a reply.

This is the upstream file; the product's overlay (images/overlays/sampling.py) replaces it in the
image. Upstream's reply omits the profile marker the release's smoke gate expects.
"""

from __future__ import annotations


def generate(state, messages: list[dict]) -> str:
    prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    return f"demo-engine reply to: {prompt[:200]}"
