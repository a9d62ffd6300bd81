"""MoE layer 17: expert routing for this layer."""

LAYER = 17
TOP_K = 8
EXPERTS = 128
