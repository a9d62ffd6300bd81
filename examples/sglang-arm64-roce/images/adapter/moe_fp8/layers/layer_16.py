"""MoE layer 16: expert routing for this layer."""

LAYER = 16
TOP_K = 8
EXPERTS = 128
