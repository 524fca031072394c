"""The preparation launch alone (index build + mask conversion, the form every version of the op
has: no status, no plan), timed the way bench/verify.py times, for comparing two checkouts in
one run, e.g. the sanitizing's cost against the last tree before the bounds checks:

  for tree in . ../old; do (cd $tree && PYTHONPATH=$PWD python3 $OLDPWD/bench/time_prepare.py grid); done

It imports whatever `ddtree_op` and `bench.cases` are first on the path (the checkout it runs in),
so the same script times any version; prints one line per case and the geomean.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch


def replay_us(launches, groups: int = 15, group_seconds: float = 1e-3) -> float:
    """Median time per launch over `groups` groups of graph replays (each ~group_seconds)."""
    for launch in launches:  # warm up outside the graph (JIT, allocator)
        launch()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for launch in launches:
            launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    replays = max(1, int(group_seconds * 1e3 / max(start.elapsed_time(end), 1e-3)))
    times = []
    for _ in range(groups):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(launches)))
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="?", default="grid", help="a tag (grid, ragged, serving) or comma-separated case names")
    parser.add_argument("--sets", type=int, default=8, help="input sets rotated in the graph")
    args = parser.parse_args(argv)
    # The checkout's own modules (PYTHONPATH), whichever version it is.
    from bench.cases import all_cases
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
        us = replay_us(launches)
        times.append(us)
        print(f"{case.name:28s} prepare {us:8.2f} us", flush=True)
    print(f"geomean {math.exp(sum(map(math.log, times)) / len(times)):.2f} us over {len(times)} cases")


if __name__ == "__main__":
    main()
