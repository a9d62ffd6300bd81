"""MoE layer 19: expert routing for this layer."""

LAYER = 19
TOP_K = 8
EXPERTS = 128
