"""MoE layer 4: expert routing for this layer."""

LAYER = 4
TOP_K = 8
EXPERTS = 128
