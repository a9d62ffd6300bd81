"""Placeholder for sglang.srt.sampling."""
