"""MoE layer 46: expert routing for this layer."""

LAYER = 46
TOP_K = 8
EXPERTS = 128
