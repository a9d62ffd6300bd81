"""MoE layer 60: expert routing for this layer."""

LAYER = 60
TOP_K = 8
EXPERTS = 128
