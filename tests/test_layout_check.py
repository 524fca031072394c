"""Host-side checks of the sm_90a kernel's layout algebra (cutlass_kernels/tests/layout_check.cu),
of the FP8 GEMM operands (cutlass_kernels/tests/fp8_operands_check.cu) and of the transposed
design's register operands (cutlass_kernels/tests/transposed_operands_check.cu): compiled with
nvcc and run on the CPU, so CI checks them without a GPU. The FP8 operands also run on an sm_90 GPU against
their definitions (cutlass_kernels/tests/fp8_operands_gpu.cu), where there is one."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import needs_cuda
from ddtree_op.build import cutlass_include_dir, kernel_source_dir
from gpu_cases import needs_sm90


@pytest.mark.parametrize("check, passed", [
    ("layout_check", "all layout checks passed"),
    ("fp8_operands_check", "all FP8 operand checks passed"),
    ("transposed_operands_check", "all transposed operand checks passed"),
])
def test_sm90_layouts_hold_on_the_host(tmp_path, check, passed):
    run_check(tmp_path, check, passed)


@needs_cuda
@needs_sm90
def test_fp8_operands_hold_on_an_sm90_gpu(tmp_path):
    run_check(tmp_path, "fp8_operands_gpu", "all FP8 operands right on the GPU", "-arch=sm_90a")


def run_check(tmp_path, check, passed, *nvcc_flags):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the layout checks need the CUDA compiler")
    try:
        include = cutlass_include_dir()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    # The check is not package code: it lies in the repository (or the sdist), not in a wheel.
    source = Path(__file__).resolve().parents[1] / "cutlass_kernels" / "tests" / f"{check}.cu"
    binary = tmp_path / check
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", *nvcc_flags, f"-I{include}", f"-I{kernel_source_dir()}",
                    str(source), "-o", str(binary)], check=True, capture_output=True, text=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert passed in result.stdout
