"""MoE layer 47: expert routing for this layer."""

LAYER = 47
TOP_K = 8
EXPERTS = 128
