"""bench.ptxas_report's reading of ptxas output: spills, registers and the wgmma serialisation notes,
which ptxas prints as info lines (the kernels themselves are compiled by the script, not here)."""

from bench.ptxas_report import parse_ptxas

_KERNEL = "_ZN6ddtree4sm9023verify_attention_kernelINS0_12VerifyTraitsIN7cutlass10bfloat16_tEEELb0ELb0EEEvNS0_12VerifyParamsE"
_OTHER = "_ZN6ddtree4sm9023verify_attention_kernelINS0_12VerifyTraitsIN7cutlass6half_tEEELb1ELb0EEEvNS0_12VerifyParamsE"

_SERIALISED = f"""ptxas info    : Compiling entry function '{_KERNEL}' for 'sm_90a'
ptxas info    : Function properties for {_KERNEL}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function '{_KERNEL}'
ptxas info    : Used 168 registers, used 16 barriers, 1504 bytes smem
ptxas info    : Compiling entry function '{_OTHER}' for 'sm_90a'
ptxas info    : Function properties for {_OTHER}
    24 bytes stack frame, 28 bytes spill stores, 32 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 1504 bytes smem
"""


def test_a_serialised_kernel_and_a_spilling_one_are_both_flagged():
    first, second = parse_ptxas(_SERIALISED)
    assert (first.name, first.registers, first.spill_stores) == (_KERNEL, 168, 0)
    assert first.serialised == ["C7511: wgmma.mma_async instructions are serialized due to insufficient register "
                                "resources for the wgmma pipeline"]
    assert not first.clean
    assert (second.spill_stores, second.spill_loads, second.serialised) == (28, 32, [])
    assert not second.clean


def test_a_kernel_without_spills_or_notes_is_clean():
    clean_text = "\n".join(_SERIALISED.splitlines()[:3]) + "\nptxas info    : Used 96 registers\n"
    (kernel,) = parse_ptxas(clean_text)
    assert kernel.clean and kernel.registers == 96


def test_the_note_that_names_the_function_with_for_is_read_too():
    """CUDA 13.0's C7512 says "... for the function '...'" (C7511 says "in the function")."""
    text = _SERIALISED.replace("for the wgmma pipeline in the function", "for the function").replace("C7511", "C7512")
    first, _ = parse_ptxas(text)
    assert first.serialised == ["C7512: wgmma.mma_async instructions are serialized due to insufficient register resources"]
    assert not first.clean
