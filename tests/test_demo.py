"""The demo (`python -m ddtree_op`) as a user runs it: a subprocess, small flags, its exit status."""

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def run_demo(*flags):
    return subprocess.run([sys.executable, "-m", "ddtree_op", *flags], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env=dict(os.environ, COLUMNS="100"))  # --help wraps at a known width


def test_demo_runs_and_checks_against_an_independent_reference():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = run_demo("--device", device, "--batch", "2", "--prefix", "40", "--q-len", "5", "--heads", "4",
                      "--iters", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend: " in result.stdout
    expected = "float32 reference" if device == "cuda" else "independent float64 brute force"
    assert f"compared with: {expected}" in result.stdout
    paths = ["eager", "torch.compile(fullgraph=True)"] + (["CUDA graph replay"] if device == "cuda" else [])
    for path in paths:
        (line,) = [line for line in result.stdout.splitlines() if line.startswith(path)]
        assert line.endswith("ok") and " ms " in line, line


def test_demo_rejects_a_bad_flag_in_one_line():
    result = run_demo("--heads", "zero")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m ddtree_op: error: argument --heads: not an integer: 'zero' (see --help)"]
    assert "Traceback" not in result.stderr


def test_demo_help_names_the_program_and_every_flag_with_its_default():
    result = run_demo("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m ddtree_op")
    for flag in ("--device", "--backend", "--heads", "--q-len", "--batch", "--prefix", "--dtype", "--iters"):
        assert flag in result.stdout
    assert "{auto,reference,triton,sm90}" in result.stdout
    assert "CPU 2 | GPU 8" in result.stdout
