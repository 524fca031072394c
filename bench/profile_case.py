"""Runs one benchmark shape for a profiler, or profiles it itself:

  ncu --clock-control none -k regex:verify_attention python -m bench.profile_case H128_n64_B8_P8192
  python -m bench.profile_case H16_n4_B1_P1024 --kernels   # per-kernel GPU time inside graph replays
  python -m bench.profile_case H16_n4_B1_P1024 --kernels --step   # the same for the whole step
  python -m bench.profile_case H16_n16_B32_P8192 --schedule persistent   # the sm90 kernel auto does not pick
  python -m bench.profile_case H16_n4_B8_P8192 --fp8   # the whole step with an e4m3 cache (bench/paged_fp8.py)
  python -m bench.profile_case H16_n1_B32_P8192 --fp8 --splits 1   # one piece a row block: 32 CTAs, the memory idle
"""

from __future__ import annotations

import argparse

import torch

from bench.cases import case_named
from bench.verify import Inputs, capture_graph, replay_seconds


def kernel_times(launches, replays: int = 20) -> None:
    """Captures `launches` in one graph as bench/verify.py does and prints, from torch.profiler
    (CUPTI), each kernel's mean GPU time per launch next to the wall time of a replay, so that
    time spent between kernels shows up as the difference."""
    graph = capture_graph(launches)
    per_launch_us = replay_seconds(graph, replays) * 1e6 / len(launches)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    print(f"graph replay: {per_launch_us:.1f} us per launch ({len(launches)} launches per graph)")
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.count:
            print(f"  {event.key[:90]:90s} {event.device_time_total / (replays * len(launches)):8.1f} us per launch "
                  f"({event.count} calls)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", help="a case name from bench/cases.py")
    parser.add_argument("--backend", default="sm90",
                        help="a backend, paged:BACKEND (the attention over 64-row pages), or flashmla (the yardstick)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--kernels", action="store_true", help="print per-kernel GPU time inside graph replays")
    parser.add_argument("--sets", type=int, default=8, help="input sets rotated in the graph (--kernels)")
    parser.add_argument("--step", action="store_true", help="the whole step (preparation + attention), not the attention alone")
    parser.add_argument("--schedule", choices=["auto", "split", "persistent"], default="auto",
                        help="the sm90 kernel's schedule: auto's choice from shapes, or one forced")
    parser.add_argument("--splits", type=int, default=0,
                        help="the sm90 kernels' key splits per row block, forced (0: auto's), as bench.time_fp8_splits does")
    parser.add_argument("--fp8", action="store_true",
                        help="the whole step with an FP8 e4m3 cache (slots, or pages with paged:BACKEND)")
    args = parser.parse_args(argv)
    import ddtree_op.backends.sm90.attention as sm90_attention

    if args.schedule != "auto":  # as bench/time_schedules.py forces it
        sm90_attention.use_persistent = lambda *shape: args.schedule == "persistent"
    if args.splits:
        sm90_attention.sm90_splits = lambda *shape: args.splits
    try:
        case = case_named(args.case)
    except ValueError as error:
        raise SystemExit(str(error))
    def launch_for(seed):
        if args.fp8:
            from bench.paged_fp8 import step_launches

            paged = args.backend.startswith("paged:")
            return step_launches(case, "paged_fp8" if paged else "slot_fp8", args.backend.split(":", 1)[-1], seed)
        inputs = Inputs(case, seed)
        if args.backend == "flashmla":
            return inputs.flashmla()
        if args.backend.startswith("paged:"):
            backend = args.backend.split(":", 1)[1]
            return inputs.paged_step(backend) if args.step else inputs.paged_attention(backend)
        return inputs.whole_step(args.backend) if args.step else inputs.attention(args.backend)

    if args.kernels:
        kernel_times([launch_for(seed) for seed in range(args.sets)])
        return
    launch = launch_for(0)
    for _ in range(args.iters):
        launch()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
