"""A whole-step variant against the default step, from one bench.verify run that timed both
(--plain-step; per_layer, a forward of prepared layers; columns in turns in one process):

  python -m bench.step_variants results.json step_plain [--backend sm90] [--small-floor 5]

Prints the geomean of step / variant over the shapes, each column's geomean over FlashMLA's where
that column exists, and per shape (those with floor < --small-floor, or all with 0) the step,
the variant, the attention alone, the preparation alone and FlashMLA.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.cases import geomean


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("variant", help="column prefix: step_plain or per_layer")
    parser.add_argument("--backend", default="sm90")
    parser.add_argument("--small-floor", type=float, default=0.0, help="list only shapes whose floor is below this (us)")
    args = parser.parse_args(argv)
    step, variant = f"step[{args.backend}]", f"{args.variant}[{args.backend}]"
    rows = [r for r in json.loads(args.results.read_text())["rows"] if variant in r["time_us"]]
    times = [r["time_us"] for r in rows]
    print(f"{len(rows)} shapes; geomean {step} / {variant} {geomean([t[step] / t[variant] for t in times]):.4f}")
    if times and "flashmla" in times[0]:
        for column in (args.backend, step, variant):
            print(f"  {column} / flashmla {geomean([t[column] / t['flashmla'] for t in times]):.4f}")
    nan = float("nan")
    for r in rows:
        t = r["time_us"]
        if args.small_floor and r["floor_us"] >= args.small_floor:
            continue
        print(f"  {r['case']}: step {t[step]:.1f} {args.variant} {t[variant]:.1f} attention {t[args.backend]:.1f} "
              f"prepare {t.get('prepare_fused', nan):.1f} FlashMLA {t.get('flashmla', nan):.1f} us")


if __name__ == "__main__":
    main()
