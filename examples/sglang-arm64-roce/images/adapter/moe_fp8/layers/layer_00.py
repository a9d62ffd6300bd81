"""MoE layer 0: expert routing for this layer."""

LAYER = 0
TOP_K = 8
EXPERTS = 128
