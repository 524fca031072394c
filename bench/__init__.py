"""Benchmarks of ddtree_op on a GPU (not part of the CPU test run; pure parts are unit-tested)."""
