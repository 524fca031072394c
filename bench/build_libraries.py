"""Builds (or finds in the JIT cache) the CUDA libraries of the ddtree_op on sys.path, each in a
process of its own so that they compile at the same time: the first step of the device scripts.
Run it from any tree (bench/device_ab.sh builds older snapshots with it): it only imports
ddtree_op.build.load_library, which every tree has."""

from __future__ import annotations

import subprocess
import sys

LIBRARIES = ("prep", "sm90")


def main() -> int:
    builds = [subprocess.Popen([sys.executable, "-c", f"import ddtree_op.build as b; b.load_library({name!r})"])
              for name in LIBRARIES]
    codes = [build.wait() for build in builds]  # a build killed by a signal returns a negative code
    return 1 if any(code != 0 for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main())
