"""MoE layer 37: expert routing for this layer."""

LAYER = 37
TOP_K = 8
EXPERTS = 128
