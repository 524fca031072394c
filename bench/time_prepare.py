"""The preparation launch alone (index build + mask conversion, the form every version of the op
has: no status, no plan), timed by the checkout's own bench/verify.py, for comparing two
checkouts in one run, e.g. the sanitizing's cost against the last tree before the bounds checks:

  cp bench/time_prepare.py ../old/bench/
  for tree in . ../old; do (cd $tree && PYTHONPATH=$PWD python3 -m bench.time_prepare grid); done

With --plan it times the fused preparation as the sm90 step runs it (the schedule plan too,
bench.verify's prepare_fused column), e.g. on ragged batches of the planner's batch sizes:

  python3 -m bench.time_prepare --plan --batches 8,32,64,128,256

It imports whatever `ddtree_op` and `bench` are first on the path (the checkout it runs in),
so the same script times any version; prints one line per case and the geomean. It rotates as
many input sets as the benchmark does (making a set's random KV takes seconds on the host).
"""

from __future__ import annotations

import argparse
import math


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="?", default="grid", help="a tag (grid, ragged, serving) or comma-separated case names")
    parser.add_argument("--sets", type=int, default=0, help="input sets rotated in the graph (0: as many as the benchmark rotates)")
    parser.add_argument("--plan", action="store_true", help="the preparation with the schedule plan, as the sm90 step runs it")
    parser.add_argument("--batches", default="", help="instead of the cases: ragged H16 batches (n 4, mean prefix 1024) of these sizes")
    args = parser.parse_args(argv)
    # The checkout's own modules (PYTHONPATH), whichever version it is.
    from bench.cases import Case, all_cases, case_named, geomean, ragged
    from bench.verify import Inputs, input_set_count, time_graph
    from ddtree_op import ops
    from ddtree_op.synthetic import make_verify_batch

    cases = [c for c in all_cases() if args.cases in getattr(c, "tags", ())]
    if not cases and not args.batches:  # case names, off the grid too (bench.cases.case_named)
        try:
            cases = [case_named(name) for name in args.cases.split(",")]
        except ValueError as error:
            raise SystemExit(str(error))
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
        cases = [Case(f"H16_n4_B{b}_P1024_ragged", 16, ragged(1024, b), (4,) * b) for b in batches]
    if not cases:
        raise SystemExit(f"no case matches {args.cases!r}")
    times = []
    for case in cases:
        launches = []
        # The batch's random q and KV (most of the time it takes to make) are dropped once made:
        # the preparation reads only the indices and the mask.
        for seed in range(args.sets or input_set_count(case)):
            if args.plan:
                launches.append(Inputs(case, seed).prepare())
                continue
            vb = make_verify_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, device="cuda", seed=seed,
                                   chain=case.chain)
            prep_args = (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "full",
                         vb.q.shape[0], math.ceil(max(case.draft_lens) / 64))
            del vb
            launches.append(lambda prep_args=prep_args: ops.prepare_verify(*prep_args))
        us = time_graph(launches) * 1e6
        times.append(us)
        print(f"{case.name:28s} prepare {us:8.2f} us", flush=True)
    print(f"geomean {geomean(times):.2f} us over {len(times)} cases")


if __name__ == "__main__":
    main()
