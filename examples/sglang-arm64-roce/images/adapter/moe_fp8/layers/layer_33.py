"""MoE layer 33: expert routing for this layer."""

LAYER = 33
TOP_K = 8
EXPERTS = 128
