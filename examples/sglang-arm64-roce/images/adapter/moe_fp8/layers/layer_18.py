"""MoE layer 18: expert routing for this layer."""

LAYER = 18
TOP_K = 8
EXPERTS = 128
