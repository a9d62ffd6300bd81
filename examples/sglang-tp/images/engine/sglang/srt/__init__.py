"""Placeholder for sglang.srt, the SGLang runtime."""
