"""Times named cases for the cutlass backend, for quick A/B runs of kernel variants:

  PYTHONPATH=$PWD python3 bench/time_cases.py H16_n4_B8_P1024,H128_n64_B8_P8192 LABEL

Same timing as bench/verify.py (graphs of up to 8 calls on rotating input sets, median of 15
groups). Variants are chosen by PYTHONPATH (another copy of ddtree_op/cutlass_kernels) and by
DDTREE_NVCC_EXTRA; `export` them, since each gets its own build.
"""
import math
import sys

from bench.cases import all_cases
from bench.verify import L2_BYTES, Inputs, time_graph

names = sys.argv[1].split(",")
label = sys.argv[2]
for case in all_cases():
    if case.name not in names:
        continue
    sets = max(1, min(8, math.ceil(3 * L2_BYTES / case.bytes())))
    inputs = [Inputs(case, s) for s in range(sets)]
    t = time_graph([i.attention("cutlass") for i in inputs]) * 1e6
    print(f"{label:28s} {case.name:24s} {t:9.1f} us", flush=True)
