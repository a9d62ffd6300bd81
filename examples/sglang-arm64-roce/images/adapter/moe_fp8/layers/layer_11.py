"""MoE layer 11: expert routing for this layer."""

LAYER = 11
TOP_K = 8
EXPERTS = 128
