"""Placeholder for vllm.entrypoints.openai."""
