"""MoE layer 10: expert routing for this layer."""

LAYER = 10
TOP_K = 8
EXPERTS = 128
