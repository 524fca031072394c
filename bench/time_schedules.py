"""Times the sm_90a kernel's two schedules on the same inputs, for choosing between them
(ddtree_op/balanced_schedule.py: MIN_UNITS_PER_CTA):

  PYTHONPATH=$PWD python3 bench/time_schedules.py all            # or grid / ragged / serving / case names

Prints per case the time with the split schedule, with the balanced one, and the mean units of
work per CTA on which the choice is made. Same timing as bench/verify.py.
"""

import sys

import ddtree_op.balanced_schedule as balanced_schedule
from bench.cases import all_cases
from bench.verify import Inputs, input_set_count, time_graph
from ddtree_op.schedule import sm_count

NEVER, ALWAYS = 10**9, 0  # MIN_UNITS_PER_CTA values that force one schedule


def units_per_cta(case, ctas: int) -> float:
    tokens = sum(case.draft_lens)
    keys = sum(p + n for p, n in zip(case.prefix_lens, case.draft_lens))
    row_blocks = -(-tokens * case.heads // balanced_schedule.ROWS_PER_BLOCK)
    return row_blocks * -(-keys // (balanced_schedule.UNIT_KEYS * case.batch)) / ctas


def main(selection: list[str]):
    saved = balanced_schedule.MIN_UNITS_PER_CTA
    for case in all_cases():
        if not ({case.name, "all"} & set(selection) or set(case.tags) & set(selection)):
            continue
        inputs = [Inputs(case, seed) for seed in range(input_set_count(case))]
        times = {}
        try:
            for name, threshold in (("split", NEVER), ("balanced", ALWAYS)):
                balanced_schedule.MIN_UNITS_PER_CTA = threshold
                times[name] = time_graph([i.attention("cutlass") for i in inputs]) * 1e6
        finally:
            balanced_schedule.MIN_UNITS_PER_CTA = saved
        units = units_per_cta(case, sm_count(inputs[0].out.device))
        print(f"{case.name:28s} units/CTA {units:7.1f}  split {times['split']:9.1f} us  balanced {times['balanced']:9.1f} us"
              f"  ratio {times['balanced'] / times['split']:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","))
