"""What the bounds checks and the status cost: the preparation launch and the whole verify step
(preparation + attention, one graph), each without and with `status=`, on the benchmark's cases
(the preparation with a status twice: as the step runs it, leaving the status to the attention
launch, and as the op alone, whose last block publishes):

  PYTHONPATH=$PWD python3 bench/time_status.py [CASE,CASE,...] [--backend sm90] [--prep-batches 1023,1024,4096]

--prep-batches times the preparation alone on synthetic batches of that many requests (1-3
drafts, prefixes of 0-39 tokens; 1023 is the largest staged batch, above it a one-block pass runs
first), without and with `status=`, and without the schedule plan (its blocks grow with the
batch: that is the status's cost alone); no cases are then timed unless named.

Same timing as bench/verify.py (graphs of up to 8 calls on rotating input sets, median of 15 groups,
the columns of a case in turns). The sanitizing itself is always on; its cost is the step here against the step of a run
before it (bench/results, same machine), or of an older checkout put first on PYTHONPATH.
"""

from __future__ import annotations

import argparse

import ddtree_op
from bench.cases import all_cases
from bench.verify import Inputs, input_set_count, time_graphs
from ddtree_op import ops


def _step(i: Inputs, backend: str, status):
    vb = i.vb
    return lambda: ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=i.out, lse=i.lse, backend=backend,
                                             max_draft_len=i.max_draft, status=status)


def time_large_batches(batches):
    from ddtree_op.synthetic import make_verify_batch

    print(f"{'requests':>10s} {'prep us':>9s} {'+status':>9s}")
    for batch in batches:
        sets = []
        for seed in range(2):
            vb = make_verify_batch([(7 * b + seed) % 40 for b in range(batch)], [1 + (b + seed) % 3 for b in range(batch)], 1,
                                   device="cuda", seed=seed)
            sets.append((vb, vb.q.shape[0]))
        status = ddtree_op.new_status("cuda")

        def launch(vb, rows, st):
            return lambda: ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                              vb.mask_indptr, "full", rows, 1, vb.kv_cache.shape[0], 0, st)

        t = time_graphs({"plain": [launch(vb, rows, None) for vb, rows in sets],
                         "status": [launch(vb, rows, status) for vb, rows in sets]})
        plain, with_status = t["plain"], t["status"]
        ddtree_op.raise_on_status(status)
        print(f"{batch:10d} {plain * 1e6:9.2f} {with_status * 1e6:9.2f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="?", help="comma-separated case names (default: all)")
    parser.add_argument("--backend", default="sm90")
    parser.add_argument("--prep-batches", default="", help="comma-separated batch sizes: the preparation alone")
    args = parser.parse_args(argv)
    if args.prep_batches:
        time_large_batches([int(b) for b in args.prep_batches.split(",")])
        if not args.cases:
            return
    names = set(args.cases.split(",")) if args.cases else None
    print(f"{'case':28s} {'prep us':>8s} {'+status':>8s} {'+alone':>8s} {'step us':>9s} {'+status':>9s} {'status %':>9s}")
    ratios = []
    for case in all_cases():
        if names is not None and case.name not in names:
            continue
        inputs = [Inputs(case, seed) for seed in range(input_set_count(case))]
        status = ddtree_op.new_status("cuda")
        step_way = "publish_status" in str(ops.prepare_verify._schema)  # else an older checkout: the op alone
        t = time_graphs({  # in turns, so that the clocks' drift during a long case weighs on each alike
            "prep": [i.prepare() for i in inputs],  # as the step runs it (plan included)
            "prep_status": [i.prepare(status, publish_status=not step_way) for i in inputs],
            "prep_alone": [i.prepare(status) for i in inputs],
            "step": [_step(i, args.backend, None) for i in inputs],
            "step_status": [_step(i, args.backend, status) for i in inputs],
        })
        prep, prep_status, prep_alone, step, step_status = (t[k] for k in ("prep", "prep_status", "prep_alone", "step", "step_status"))
        ddtree_op.raise_on_status(status)  # the benchmark's inputs are valid
        ratios.append(step_status / step)
        print(f"{case.name:28s} {prep * 1e6:8.2f} {prep_status * 1e6:8.2f} {prep_alone * 1e6:8.2f} {step * 1e6:9.2f} "
              f"{step_status * 1e6:9.2f} "
              f"{(step_status / step - 1) * 100:+8.2f}%", flush=True)
    if ratios:
        geomean = 1.0
        for r in ratios:
            geomean *= r ** (1 / len(ratios))
        print(f"status: geomean step overhead {(geomean - 1) * 100:+.2f}% over {len(ratios)} cases, "
              f"max {(max(ratios) - 1) * 100:+.2f}%")


if __name__ == "__main__":
    main()
