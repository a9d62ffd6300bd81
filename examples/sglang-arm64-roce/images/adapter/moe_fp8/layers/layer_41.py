"""MoE layer 41: expert routing for this layer."""

LAYER = 41
TOP_K = 8
EXPERTS = 128
