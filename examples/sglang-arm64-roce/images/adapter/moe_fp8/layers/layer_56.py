"""MoE layer 56: expert routing for this layer."""

LAYER = 56
TOP_K = 8
EXPERTS = 128
