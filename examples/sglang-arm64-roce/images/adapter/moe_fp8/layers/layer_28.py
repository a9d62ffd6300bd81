"""MoE layer 28: expert routing for this layer."""

LAYER = 28
TOP_K = 8
EXPERTS = 128
