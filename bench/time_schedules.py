"""Times the sm_90a split and persistent kernels on the same inputs, for choosing between them
(ddtree_op/backends/sm90/persistent_schedule.py):

  PYTHONPATH=$PWD python3 bench/time_schedules.py ragged,grid      # tags of bench/cases.py, case names, or all

Prints per case both times, the mean units of work per CTA, and the plan the persistent kernel's
device code picks for the case's lengths (pieces or equal shares). Same timing as bench/verify.py.
"""

import sys

import ddtree_op.backends.sm90.attention as sm90_attention
from bench.cases import all_cases
from bench.verify import Inputs, input_set_count, time_graph
from ddtree_op.backends.sm90.persistent_schedule import plan, row_blocks_and_units, use_persistent
from ddtree_op.backends.sm90.schedule import sm90_splits
from ddtree_op.backends.splits import sm_count


def describe(case, ctas: int) -> str:
    qo, kv = case.indptrs()
    tokens, keys = qo[-1], kv[-1]
    splits = sm90_splits(tokens, case.heads, case.batch, keys, ctas)
    equal, _ = plan(qo, kv, case.heads, ctas, splits)
    units = row_blocks_and_units(tokens, case.heads, case.batch, keys)[1] / ctas
    auto = "persistent" if use_persistent(tokens, case.heads, case.batch, keys, ctas, splits) else "split"
    return f"units/CTA {units:6.1f} splits {splits:3d} plan {'equal' if equal else 'pieces'} auto {auto:10s}"


def main(selection: list[str]):
    chooser = sm90_attention.use_persistent
    for case in all_cases():
        if not ({case.name, "all"} & set(selection) or set(case.tags) & set(selection)):
            continue
        inputs = [Inputs(case, seed) for seed in range(input_set_count(case))]
        times = {}
        try:
            for kernel in ("split", "persistent"):
                sm90_attention.use_persistent = lambda *args, kernel=kernel: kernel == "persistent"
                times[kernel] = time_graph([i.attention("sm90") for i in inputs]) * 1e6
        finally:
            sm90_attention.use_persistent = chooser
        print(f"{case.name:28s} {describe(case, sm_count(inputs[0].out.device))}  split {times['split']:8.1f} us  "
              f"persistent {times['persistent']:8.1f} us  ratio {times['persistent'] / times['split']:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","))
