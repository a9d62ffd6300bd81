"""Routes attention to the DCU kernels (flash_attn, or the legacy build for TP2)."""

BACKEND = "flash_attn"
