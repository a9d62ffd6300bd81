"""MoE layer 9: expert routing for this layer."""

LAYER = 9
TOP_K = 8
EXPERTS = 128
