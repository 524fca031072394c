"""Static SASS opcode counts of one kernel of a built library or extension (cuobjdump on the GPU
machine): how many integer, conversion, FP and tensor instructions a loop body costs, before any
profile.

    python3 -m bench.sass_census LIBRARY.so KERNEL_SUBSTRING [--top 30]

Counts each opcode's base name (IMAD.SHL.U32 -> IMAD) over the first kernel whose mangled name
contains KERNEL_SUBSTRING; predicated instructions count too."""

from __future__ import annotations

import argparse
import collections
import re
import subprocess

_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def opcode_counts(sass: str, kernel: str) -> tuple[str, collections.Counter]:
    """The first function whose name contains `kernel`, and its opcodes' counts."""
    counts: collections.Counter = collections.Counter()
    name = None
    for line in sass.splitlines():
        if match := _FUNCTION.match(line):
            if name is not None:
                break
            if kernel in match.group(1):
                name = match.group(1)
            continue
        if name is not None and (match := _INSTRUCTION.search(line)):
            counts[match.group(1)] += 1
    if name is None:
        raise SystemExit(f"no kernel whose name contains {kernel!r}")
    return name, counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library")
    parser.add_argument("kernel")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    sass = subprocess.run(["cuobjdump", "-sass", args.library], capture_output=True, text=True, check=True).stdout
    name, counts = opcode_counts(sass, args.kernel)
    print(f"{name}: {sum(counts.values())} instructions")
    print("  ".join(f"{op} {n}" for op, n in counts.most_common(args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
