"""Tables, plot and summary from a benchmark's results.json: `python -m bench.report DIR`.

Rendering is separate from measuring so that a committed run can be re-rendered (or compared)
without a GPU. Names starting with index/mask/prepare/step are the preparation ops and the whole
verify step; the rest are attention backends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.cases import geomean

PREP_OP_PREFIXES = ("index", "mask", "prepare")  # preparation ops timed alone (no speed of light)
PREP_PREFIXES = PREP_OP_PREFIXES + ("step",)


def rates(row: dict, name: str) -> tuple[float, float]:
    """(TFLOP/s, TB/s) of one timed backend on one shape."""
    seconds = row["time_us"][name] * 1e-6
    return row["flops"] / seconds / 1e12, row["bytes"] / seconds / 1e12


def summarize(rows: list[dict], backends: list[str]) -> dict:
    grid = [r for r in rows if "grid" in r["tags"]]
    summary = {}
    for b in backends:
        timed = [r for r in grid if b in r["time_us"]]
        if not timed:
            continue
        small = [r["time_us"][b] for r in timed if r["floor_us"] < 5]
        summary[b] = {
            "geomean_sol_fraction_floor_ge_20us": geomean([r["sol_fraction"][b] for r in timed if r["floor_us"] >= 20]),
            "max_us_floor_lt_5us": max(small) if small else None,
            "geomean_speedup_vs_baseline": geomean([r["speedup_vs_baseline"][b] for r in timed if b in r.get("speedup_vs_baseline", {})]),
            "geomean_sol_fraction_grid": geomean([r["sol_fraction"][b] for r in timed]),
        }
    return summary


def target_lines(rows: list[dict], backend: str) -> list[str]:
    """The performance targets that the headline table does not show, for one backend."""
    lines = []
    step = f"step[{backend}]"
    stepped = [r for r in rows if step in r["time_us"] and backend in r["time_us"]]
    if stepped:
        extra = [r["time_us"][step] - r["time_us"][backend] for r in stepped]
        within = sum(e <= max(3.0, 0.1 * r["time_us"][backend]) for e, r in zip(extra, stepped))
        lines.append(f"- whole step (preparation + attention, one graph) within 10% or 3 us of attention alone: "
                     f"{within} of {len(stepped)} shapes; extra time {min(extra):.1f} .. {max(extra):.1f} us")
    by_name = {r["case"]: r for r in rows}
    ratios = [r["time_us"][backend] / by_name[r["case"][: -len("_ragged")]]["time_us"][backend]
              for r in rows if r["case"].endswith("_ragged") and backend in r["time_us"]
              and backend in by_name.get(r["case"][: -len("_ragged")], {}).get("time_us", {})]
    if ratios:
        lines.append(f"- ragged / uniform time (same total work): {min(ratios):.2f} .. {max(ratios):.2f}; "
                     f"{sum(0.85 <= x <= 1.15 for x in ratios)} of {len(ratios)} within 15%")
    if backend != "triton":
        versus = [r for r in rows if backend in r["time_us"] and "triton" in r["time_us"]]
        slower = [r["case"] for r in versus if r["time_us"][backend] >= r["time_us"]["triton"]]
        if versus:
            lines.append(f"- faster than triton on {len(versus) - len(slower)} of {len(versus)} shapes"
                         + (f" (not on: {', '.join(slower)})" if slower else ""))
    return lines


def time_table(rows: list[dict], names: list[str]) -> str:
    """Per shape: time and fraction of speed of light of every timed name."""
    header = f"{'case':34s} {'floor':>8s} " + " ".join(f"{n[:18]:>18s}" for n in names)
    lines = [header, "-" * len(header)]
    for r in rows:
        cells = []
        for n in names:
            t, sol = r["time_us"].get(n), r["sol_fraction"].get(n)
            cells.append(" " * 18 if t is None else f"{t:9.1f}us" + (f" {sol:6.1%}" if sol is not None else " " * 7))
        lines.append(f"{r['case']:34s} {r['floor_us']:7.1f}u " + " ".join(f"{c:>18s}" for c in cells))
    return "\n".join(lines)


def rate_table(rows: list[dict], name: str) -> str:
    """Per shape, for one backend: TFLOP/s, TB/s, fraction of speed of light, speed-up."""
    lines = [f"| case | floor us | {name} us | TFLOP/s | TB/s | SoL | vs baseline |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if name not in r["time_us"]:
            continue
        tflops, tbps = rates(r, name)
        speedup = r.get("speedup_vs_baseline", {}).get(name)
        lines.append(f"| {r['case']} | {r['floor_us']:.1f} | {r['time_us'][name]:.1f} | {tflops:.1f} | {tbps:.2f} | "
                     f"{r['sol_fraction'][name]:.3f} | {'-' if speedup is None else f'{speedup:.1f}x'} |")
    return "\n".join(lines)


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.3), 5))
    width = 0.8 / max(len(names), 1)
    for k, n in enumerate(names):
        ax.bar([i + k * width for i in range(len(rows))], [r["sol_fraction"].get(n, 0) for r in rows], width, label=n)
    ax.set_xticks([i + 0.4 for i in range(len(rows))], [r["case"] for r in rows], rotation=90, fontsize=6)
    ax.set_ylabel("fraction of speed of light")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(out_dir: Path, results: dict) -> None:
    meta, rows = results["meta"], results["rows"]
    names = sorted({n for r in rows for n in r["time_us"]}, key=lambda n: (n.startswith(PREP_PREFIXES), n))
    attention = [n for n in names if not n.startswith(PREP_PREFIXES)]
    ours = [n for n in attention if n != "sglang_baseline"]
    results["summary"] = summarize(rows, ours)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    table = time_table(rows, names)
    (out_dir / "table.txt").write_text(table + "\n")
    print(table)
    try:
        plot(rows, attention, out_dir / "sol_fraction.png")
    except ImportError:
        print("matplotlib missing: no plot")
    ceilings = meta["ceilings"]
    md = [f"# Verify benchmark {meta['date']}, {meta['gpu']}, commit {meta['commit']}", "",
          f"Ceilings measured in this run: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {ceilings['bf16_flops'] / 1e12:.0f} TFLOP/s (torch {meta.get('torch', '?')}).", "",
          "| backend | geomean SoL (grid, floor >= 20us) | max us (floor < 5us) | geomean speed-up vs baseline | geomean SoL (grid) |",
          "|---|---|---|---|---|"]
    for b, s in results["summary"].items():
        small = "-" if s["max_us_floor_lt_5us"] is None else f"{s['max_us_floor_lt_5us']:.1f}"
        md.append(f"| {b} | {s['geomean_sol_fraction_floor_ge_20us']:.3f} | {small} | "
                  f"{s['geomean_speedup_vs_baseline']:.1f}x | {s['geomean_sol_fraction_grid']:.3f} |")
    if ours:
        md += [""] + target_lines(rows, ours[0])
        md += ["", f"## {ours[0]} per shape", "", rate_table(rows, ours[0])]
    md += ["", "All times and fractions of speed of light: table.txt; raw numbers: results.json; plot: sol_fraction.png."]
    (out_dir / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:len(results["summary"]) + 6]))


if __name__ == "__main__":
    directory = Path(sys.argv[1])
    write_report(directory, json.loads((directory / "results.json").read_text()))
