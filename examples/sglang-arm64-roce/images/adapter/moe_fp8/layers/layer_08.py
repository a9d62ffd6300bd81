"""MoE layer 8: expert routing for this layer."""

LAYER = 8
TOP_K = 8
EXPERTS = 128
