"""MoE layer 34: expert routing for this layer."""

LAYER = 34
TOP_K = 8
EXPERTS = 128
