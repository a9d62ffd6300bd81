"""MoE layer 5: expert routing for this layer."""

LAYER = 5
TOP_K = 8
EXPERTS = 128
