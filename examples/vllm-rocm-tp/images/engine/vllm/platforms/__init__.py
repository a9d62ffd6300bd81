"""Placeholder for vllm.platforms: picks the platform module for the GPUs it finds."""
