"""MoE layer 25: expert routing for this layer."""

LAYER = 25
TOP_K = 8
EXPERTS = 128
