"""MoE layer 29: expert routing for this layer."""

LAYER = 29
TOP_K = 8
EXPERTS = 128
