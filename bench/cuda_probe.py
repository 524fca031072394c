"""The GPU probes' harness (bench/tma_row_probe.py, bench/cluster_exchange_probe.py): one CUDA
program, built with nvcc for sm_90a in a temporary directory and run, its output on stdout."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def build_and_run(source: str, name: str) -> int:
    """Builds `source` as NAME.cu and runs it; its exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / f"{name}.cu", Path(tmp) / name
        src.write_text(source)
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", str(src), "-o", str(exe)], check=True)
        return subprocess.run([str(exe)]).returncode
