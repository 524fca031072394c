"""Where an sm90 kernel's warps spend their time, role by role, from an ncu source-page export:

  ncu --clock-control none --set full -k regex:verify_attention -c 1 -o prof python -m bench.profile_case CASE
  ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
  python -m bench.ncu_roles sass.csv [--top 12] [--ranges 3800-9000,9000-e000]

Splits the SASS into the code each `setmaxnreg` reaches (bench/sass_regions.py: the GEMM
warpgroups, the gather) and the rest (the prologue), and prints for each its share of the warp
stall samples and executed instructions, its stall reasons, its executed instruction mix and
the instructions with the most samples (offsets from the kernel's first instruction). --ranges
sums offset ranges too (for instance each GEMM warpgroup's branch, read off the listing).
"""

from __future__ import annotations

import argparse
import collections
import csv

from bench.sass_regions import PREDICATE, reachable

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path: str):
    rows = list(csv.reader(open(path)))
    header = rows[1]  # rows[0] names the kernel
    column = {h: i for i, h in enumerate(header)}
    data = [r for r in rows[2:] if len(r) >= len(header)]
    code = [(int(r[0], 16), r[1].strip()) for r in data]
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    return code, data, column, stalls


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summary(name, indices, code, data, column, stalls, total_samples, total_executed, top):
    samples = sum(number(data[i][column[SAMPLES]]) for i in indices)
    executed = sum(number(data[i][column[EXECUTED]]) for i in indices)
    reasons = collections.Counter()
    mix = collections.Counter()
    for i in indices:
        for h in stalls:
            reasons[h[len("stall_"):]] += number(data[i][column[h]])
        mix[PREDICATE.sub("", code[i][1]).split()[0].split(".")[0]] += number(data[i][column[EXECUTED]])
    lines = [f"== {name}: {len(indices)} instructions, samples {samples:.0f} ({100 * samples / max(total_samples, 1):.1f}%), "
             f"executed {executed:.0f} ({100 * executed / max(total_executed, 1):.1f}%)",
             "  stalls: " + ", ".join(f"{k} {100 * v / max(samples, 1):.1f}%" for k, v in reasons.most_common(8)),
             "  executed: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in mix.most_common(16))]
    base = code[0][0]
    for i in sorted(indices, key=lambda i: -number(data[i][column[SAMPLES]]))[:top]:
        worst = max(stalls, key=lambda h: number(data[i][column[h]]))
        lines.append(f"  {code[i][0] - base:6x} {number(data[i][column[SAMPLES]]):7.0f} samples ({worst[len('stall_'):]}), "
                     f"executed {number(data[i][column[EXECUTED]]):9.0f}  {code[i][1][:72]}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--ranges", default="", help="comma-separated hex offset ranges START-END")
    args = parser.parse_args(argv)
    code, data, column, stalls = load(args.csv)
    total_samples = sum(number(r[column[SAMPLES]]) for r in data)
    total_executed = sum(number(r[column[EXECUTED]]) for r in data)
    print(f"{len(code)} instructions, {total_samples:.0f} samples, {total_executed:.0f} executed warp instructions")
    roles = {}
    for i, (_, text) in enumerate(code):
        if "USETMAXREG" in text:
            roles["gather" if "DEALLOC" in text else "GEMM warpgroups"] = reachable(code, i)[0]
    roles["prologue and the rest"] = set(range(len(code))) - set().union(*roles.values())
    base = code[0][0]
    for spec in filter(None, args.ranges.split(",")):
        start, end = (int(x, 16) for x in spec.split("-"))
        roles[f"offsets {spec}"] = {i for i, (a, _) in enumerate(code) if start <= a - base < end}
    for name, indices in roles.items():
        print("\n".join(summary(name, indices, code, data, column, stalls, total_samples, total_executed, args.top)))


if __name__ == "__main__":
    main()
