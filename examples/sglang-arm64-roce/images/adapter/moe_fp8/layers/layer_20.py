"""MoE layer 20: expert routing for this layer."""

LAYER = 20
TOP_K = 8
EXPERTS = 128
