"""MoE layer 55: expert routing for this layer."""

LAYER = 55
TOP_K = 8
EXPERTS = 128
