"""MoE layer 51: expert routing for this layer."""

LAYER = 51
TOP_K = 8
EXPERTS = 128
