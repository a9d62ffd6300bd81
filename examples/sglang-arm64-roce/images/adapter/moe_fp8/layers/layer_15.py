"""MoE layer 15: expert routing for this layer."""

LAYER = 15
TOP_K = 8
EXPERTS = 128
