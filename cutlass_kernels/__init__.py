"""CUDA/CuTe sources of ddtree_op, shipped as package data and compiled by ddtree_op.build."""
