"""MoE layer 14: expert routing for this layer."""

LAYER = 14
TOP_K = 8
EXPERTS = 128
