"""MoE layer 42: expert routing for this layer."""

LAYER = 42
TOP_K = 8
EXPERTS = 128
