"""MoE layer 53: expert routing for this layer."""

LAYER = 53
TOP_K = 8
EXPERTS = 128
