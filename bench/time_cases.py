"""Times named cases for the sm90 backend, for quick A/B runs of kernel variants:

  PYTHONPATH=$PWD python3 bench/time_cases.py H16_n4_B8_P1024,H128_n64_B8_P8192 LABEL

Same timing as bench/verify.py (graphs of up to 8 calls on rotating input sets, median of 15
groups). Variants are chosen by PYTHONPATH (another copy of ddtree_op/cutlass_kernels) and by
DDTREE_NVCC_EXTRA; `export` them, since each gets its own build.
"""

import sys

from bench.cases import all_cases
from bench.verify import Inputs, input_set_count, time_graph


def main(names: list[str], label: str):
    for case in all_cases():
        if case.name not in names:
            continue
        inputs = [Inputs(case, seed) for seed in range(input_set_count(case))]
        seconds = time_graph([i.attention("sm90") for i in inputs])
        print(f"{label:28s} {case.name:24s} {seconds * 1e6:9.1f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2])
