"""MoE layer 48: expert routing for this layer."""

LAYER = 48
TOP_K = 8
EXPERTS = 128
