"""MoE layer 22: expert routing for this layer."""

LAYER = 22
TOP_K = 8
EXPERTS = 128
