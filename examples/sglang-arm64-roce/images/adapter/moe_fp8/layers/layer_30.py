"""MoE layer 30: expert routing for this layer."""

LAYER = 30
TOP_K = 8
EXPERTS = 128
