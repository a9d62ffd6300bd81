"""MoE layer 32: expert routing for this layer."""

LAYER = 32
TOP_K = 8
EXPERTS = 128
