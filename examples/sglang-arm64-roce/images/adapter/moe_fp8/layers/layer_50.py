"""MoE layer 50: expert routing for this layer."""

LAYER = 50
TOP_K = 8
EXPERTS = 128
