"""MoE layer 31: expert routing for this layer."""

LAYER = 31
TOP_K = 8
EXPERTS = 128
