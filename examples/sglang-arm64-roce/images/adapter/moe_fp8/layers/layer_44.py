"""MoE layer 44: expert routing for this layer."""

LAYER = 44
TOP_K = 8
EXPERTS = 128
