"""MoE layer 43: expert routing for this layer."""

LAYER = 43
TOP_K = 8
EXPERTS = 128
