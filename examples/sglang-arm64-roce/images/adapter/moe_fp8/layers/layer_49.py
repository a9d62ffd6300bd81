"""MoE layer 49: expert routing for this layer."""

LAYER = 49
TOP_K = 8
EXPERTS = 128
