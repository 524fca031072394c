"""The Triton kernels' logic on the CPU, through Triton's interpreter (no GPU needed)."""

from conftest import run_interpreter_script


def test_triton_kernels_match_reference_in_the_interpreter():
    run_interpreter_script("interpret_triton.py")
