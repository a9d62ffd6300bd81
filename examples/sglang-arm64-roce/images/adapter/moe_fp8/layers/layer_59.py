"""MoE layer 59: expert routing for this layer."""

LAYER = 59
TOP_K = 8
EXPERTS = 128
