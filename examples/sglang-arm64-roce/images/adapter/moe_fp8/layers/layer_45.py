"""MoE layer 45: expert routing for this layer."""

LAYER = 45
TOP_K = 8
EXPERTS = 128
