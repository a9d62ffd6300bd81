"""MoE layer 3: expert routing for this layer."""

LAYER = 3
TOP_K = 8
EXPERTS = 128
