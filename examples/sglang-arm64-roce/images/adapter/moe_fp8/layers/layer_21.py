"""MoE layer 21: expert routing for this layer."""

LAYER = 21
TOP_K = 8
EXPERTS = 128
