"""MoE layer 35: expert routing for this layer."""

LAYER = 35
TOP_K = 8
EXPERTS = 128
