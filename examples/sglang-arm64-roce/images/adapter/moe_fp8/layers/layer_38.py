"""MoE layer 38: expert routing for this layer."""

LAYER = 38
TOP_K = 8
EXPERTS = 128
