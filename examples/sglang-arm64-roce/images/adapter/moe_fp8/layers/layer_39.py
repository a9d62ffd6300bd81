"""MoE layer 39: expert routing for this layer."""

LAYER = 39
TOP_K = 8
EXPERTS = 128
