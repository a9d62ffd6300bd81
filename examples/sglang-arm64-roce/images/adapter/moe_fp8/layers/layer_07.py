"""MoE layer 7: expert routing for this layer."""

LAYER = 7
TOP_K = 8
EXPERTS = 128
