"""Host-side checks of the sm_90a kernel's layout algebra (cutlass_kernels/tests/layout_check.cu) and
of the FP8 GEMM operands (cutlass_kernels/tests/fp8_operands_check.cu): compiled with nvcc and run
on the CPU, so CI checks them without a GPU."""

import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_op.build import cutlass_include_dir, kernel_source_dir


@pytest.mark.parametrize("check, passed", [
    ("layout_check", "all layout checks passed"),
    ("fp8_operands_check", "all FP8 operand checks passed"),
])
def test_sm90_layouts_hold_on_the_host(tmp_path, check, passed):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the host-side layout check needs the CUDA compiler")
    try:
        include = cutlass_include_dir()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    # The check is not package code: it lies in the repository (or the sdist), not in a wheel.
    source = Path(__file__).resolve().parents[1] / "cutlass_kernels" / "tests" / f"{check}.cu"
    binary = tmp_path / check
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{include}", f"-I{kernel_source_dir()}",
                    str(source), "-o", str(binary)], check=True, capture_output=True, text=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert passed in result.stdout
