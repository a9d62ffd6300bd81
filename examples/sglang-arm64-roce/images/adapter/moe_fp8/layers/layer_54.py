"""MoE layer 54: expert routing for this layer."""

LAYER = 54
TOP_K = 8
EXPERTS = 128
