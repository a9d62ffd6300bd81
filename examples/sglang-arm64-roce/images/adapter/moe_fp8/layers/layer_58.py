"""MoE layer 58: expert routing for this layer."""

LAYER = 58
TOP_K = 8
EXPERTS = 128
