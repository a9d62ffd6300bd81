"""MoE layer 27: expert routing for this layer."""

LAYER = 27
TOP_K = 8
EXPERTS = 128
