"""CUDA/CuTe sources of ddtree_op. Installed as `ddtree_op/csrc/` (package data) and compiled by
ddtree_op.build; nothing here is imported."""
