"""MoE layer 40: expert routing for this layer."""

LAYER = 40
TOP_K = 8
EXPERTS = 128
