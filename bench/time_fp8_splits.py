"""Times the whole verify step with an e4m3 cache on the sm90 transposed kernel at several key
splits per row block, beside the bf16 step, for choosing the transposed kernel's splits (its start
a piece is longer than the bf16 kernel's, for whose economics `schedule.sm90_splits` picks them):

  PYTHONPATH=$PWD python3 -m bench.time_fp8_splits H16_n1_B32_P8192,H16_n4_B8_P8192 [1,2,4,8,16,32]

Cases: bench.cases.case_named. Prints per case the bf16 step, then for `auto` (sm90_splits' choice)
and each forced count the FP8 step and its ratio to bf16, with the CTAs it launches. A forced count
other than the preparation's adds one plan launch (`attention.make_plan`), so it is timed a little
against itself. Same timing as bench/verify.py (CUDA-graph replays over rotating input sets).
"""

from __future__ import annotations

import sys

import torch

import ddtree_op.backends.sm90.attention as sm90_attention
from bench.cases import case_named
from bench.paged_fp8 import sm90_fp8_kernel, time_step
from ddtree_op.backends.sm90.schedule import plan_shape
from ddtree_op.backends.splits import sm_count

DEFAULT_SPLITS = (1, 2, 4, 8, 16, 32)


def main(argv: list[str]) -> None:
    cases = [case_named(name) for name in argv[0].split(",")]
    counts = [int(s) for s in argv[1].split(",")] if len(argv) > 1 else list(DEFAULT_SPLITS)
    chosen = sm90_attention.sm90_splits
    sms = sm_count(torch.device("cuda"))
    try:
        with sm90_fp8_kernel("transposed"):
            for case in cases:
                bf16 = time_step(case, "slot", "sm90")
                qo, kv = case.indptrs()
                ctas, _ = plan_shape(sms, qo[-1], case.heads, case.batch, kv[-1])
                row_blocks = sum(-(-(n * case.heads) // 64) for n in case.draft_lens)
                cells = []
                for count in [None, *counts]:
                    sm90_attention.sm90_splits = chosen if count is None else (lambda *args, count=count: count)
                    splits = chosen(qo[-1], case.heads, case.batch, kv[-1], ctas) if count is None else count
                    fp8 = time_step(case, "slot_fp8", "sm90")
                    cells.append(f"{'auto' if count is None else count}: {fp8 * 1e6:7.1f}us {fp8 / bf16:.3f} "
                                 f"(<= {row_blocks * splits} CTAs)")
                print(f"{case.name:24s} bf16 {bf16 * 1e6:7.1f}us | " + " | ".join(cells), flush=True)
    finally:
        sm90_attention.sm90_splits = chosen


if __name__ == "__main__":
    main(sys.argv[1:])
