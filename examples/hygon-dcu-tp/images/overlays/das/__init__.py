"""The DAS (Hygon DCU) platform for vLLM, baked as a folder overlay."""
