"""Placeholder for vllm.entrypoints."""
