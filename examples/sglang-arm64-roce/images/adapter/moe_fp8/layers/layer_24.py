"""MoE layer 24: expert routing for this layer."""

LAYER = 24
TOP_K = 8
EXPERTS = 128
