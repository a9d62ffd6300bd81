"""MoE layer 1: expert routing for this layer."""

LAYER = 1
TOP_K = 8
EXPERTS = 128
