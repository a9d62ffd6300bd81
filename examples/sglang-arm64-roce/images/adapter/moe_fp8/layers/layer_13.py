"""MoE layer 13: expert routing for this layer."""

LAYER = 13
TOP_K = 8
EXPERTS = 128
