"""MoE layer 26: expert routing for this layer."""

LAYER = 26
TOP_K = 8
EXPERTS = 128
