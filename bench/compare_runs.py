"""Two or more results.json files of kernel variants timed in one device session, side by side:

  python -m bench.compare_runs main=grid_main.json v14=grid_v14.json [--columns sm90,paged:sm90]

Prints each shape's time per variant and column, then per column the geomean (and range) of
each variant's time over the first variant's, shape by shape, and of each over FlashMLA's time
in its own run where that column exists (FlashMLA's drift between the runs shows how far the
runs' conditions moved).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.cases import geomean


def load(spec: str) -> tuple[str, dict[str, dict[str, float]]]:
    name, _, path = spec.rpartition("=")
    rows = json.loads(Path(path).read_text())["rows"]
    return name or Path(path).stem, {r["case"]: r["time_us"] for r in rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="NAME=results.json (the first is the base)")
    parser.add_argument("--columns", default="sm90,paged:sm90", help="comma list of timed columns to compare")
    args = parser.parse_args(argv)
    runs = [load(spec) for spec in args.runs]
    columns = args.columns.split(",")
    cases = [c for c in runs[0][1] if all(c in times for _, times in runs)]
    header = " ".join(f"{name + ' ' + col:>18s}" for col in columns for name, _ in runs)
    print(f"{'case':26s} {header}")
    for case in cases:
        cells = " ".join(f"{times[case].get(col, float('nan')):18.1f}" for col in columns for _, times in runs)
        print(f"{case:26s} {cells}")
    base_name, base = runs[0]
    for col in columns:
        for name, times in runs:
            shared = [c for c in cases if col in times[c] and col in base[c]]
            if name != base_name and shared:
                ratios = [times[c][col] / base[c][col] for c in shared]
                print(f"{col}: {name} / {base_name} {geomean(ratios):.4f} ({min(ratios):.3f}-{max(ratios):.3f}, {len(shared)} shapes)")
            vs = [times[c][col] / times[c]["flashmla"] for c in cases if col in times[c] and "flashmla" in times[c]]
            if vs:
                print(f"{col}: {name} / FlashMLA {geomean(vs):.3f} (worst {max(vs):.3f})")


if __name__ == "__main__":
    main()
