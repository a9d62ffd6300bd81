"""MoE layer 36: expert routing for this layer."""

LAYER = 36
TOP_K = 8
EXPERTS = 128
