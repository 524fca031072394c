"""The Triton kernels' logic on the CPU, through Triton's interpreter (no GPU needed)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_triton_kernels_match_reference_in_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed: the interpreter check needs it")
    numpy = pytest.importorskip("numpy")
    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip("Triton 3.6's interpreter fails on numpy >= 2.4 (size-1 arrays as loop bounds)")
    script = Path(__file__).with_name("interpret_triton.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(script.parents[1]), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "interpreter: all cases match" in result.stdout
