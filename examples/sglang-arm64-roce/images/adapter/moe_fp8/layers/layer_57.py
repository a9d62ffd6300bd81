"""MoE layer 57: expert routing for this layer."""

LAYER = 57
TOP_K = 8
EXPERTS = 128
