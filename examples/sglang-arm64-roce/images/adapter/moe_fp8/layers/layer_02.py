"""MoE layer 2: expert routing for this layer."""

LAYER = 2
TOP_K = 8
EXPERTS = 128
