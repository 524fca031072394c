"""The preparation launch alone (index build + mask conversion, the form every version of the op
has: no status, no plan), timed by the checkout's own bench/verify.py, for comparing two
checkouts in one run, e.g. the sanitizing's cost against the last tree before the bounds checks:

  for tree in . ../old; do (cd $tree && PYTHONPATH=$PWD python3 $OLDPWD/bench/time_prepare.py grid); done

It imports whatever `ddtree_op` and `bench` are first on the path (the checkout it runs in),
so the same script times any version; prints one line per case and the geomean.
"""

from __future__ import annotations

import argparse
import math


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="?", default="grid", help="a tag (grid, ragged, serving) or comma-separated case names")
    parser.add_argument("--sets", type=int, default=8, help="input sets rotated in the graph")
    args = parser.parse_args(argv)
    # The checkout's own modules (PYTHONPATH), whichever version it is.
    from bench.cases import all_cases
    from bench.verify import time_graph
    from ddtree_op import ops
    from ddtree_op.synthetic import make_verify_batch

    names = set(args.cases.split(","))
    cases = [c for c in all_cases() if c.name in names or args.cases in getattr(c, "tags", ())]
    if not cases:
        raise SystemExit(f"no case matches {args.cases!r}")
    times = []
    for case in cases:
        launches = []
        for seed in range(args.sets):
            vb = make_verify_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, device="cuda", seed=seed,
                                   chain=case.chain)
            rows, words = vb.q.shape[0], math.ceil(max(case.draft_lens) / 64)
            launches.append(lambda vb=vb, rows=rows, words=words: ops.prepare_verify(
                vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "full", rows, words))
        us = time_graph(launches) * 1e6
        times.append(us)
        print(f"{case.name:28s} prepare {us:8.2f} us", flush=True)
    print(f"geomean {math.exp(sum(map(math.log, times)) / len(times)):.2f} us over {len(times)} cases")


if __name__ == "__main__":
    main()
