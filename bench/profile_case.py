"""Runs one benchmark shape a few times, eagerly, for a profiler to capture:
`ncu --clock-control none -k regex:verify_attention python -m bench.profile_case H128_n64_B8_P8192`."""

from __future__ import annotations

import argparse

import torch

from bench.cases import all_cases
from bench.verify import Inputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("case", help="a case name from bench/cases.py")
    parser.add_argument("--backend", default="cutlass")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)
    case = next((c for c in all_cases() if c.name == args.case), None)
    if case is None:
        raise SystemExit(f"unknown case {args.case!r}")
    launch = Inputs(case, seed=0).attention(args.backend)
    for _ in range(args.iters):
        launch()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
