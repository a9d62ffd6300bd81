"""MoE layer 6: expert routing for this layer."""

LAYER = 6
TOP_K = 8
EXPERTS = 128
