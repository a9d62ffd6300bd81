"""Placeholder for the vLLM fork's source tree (vllm/ in the real repository).

Only a handful of files stand in for the whole package, enough to show where the engine, the
overlay and the launcher go. A real product puts its fork's source here.
"""

__version__ = "0.8.5"
