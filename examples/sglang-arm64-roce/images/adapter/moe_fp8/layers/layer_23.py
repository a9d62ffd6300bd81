"""MoE layer 23: expert routing for this layer."""

LAYER = 23
TOP_K = 8
EXPERTS = 128
