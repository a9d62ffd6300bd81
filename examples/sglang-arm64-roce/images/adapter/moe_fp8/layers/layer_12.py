"""MoE layer 12: expert routing for this layer."""

LAYER = 12
TOP_K = 8
EXPERTS = 128
