"""MoE layer 52: expert routing for this layer."""

LAYER = 52
TOP_K = 8
EXPERTS = 128
