"""bench/sass_regions.py on a hand-written SASS listing: each setmaxnreg role's reachable code,
its highest register (wide operands and HGMMA accumulators included), its spills, and a GEMM
role's distance to its first HGMMA."""

from bench import sass_regions

LISTING = """
		Function : kernel_a
        /*0000*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0010*/               @P0 BRA 0x60 ;
        /*0020*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR24], RZ, !UPT ;
        /*0040*/                   LDS.128 R200, [R3] ;
        /*0050*/                   EXIT ;
        /*0060*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;
        /*0070*/                   STL [R1+0x8], R38 ;
        /*0080*/               @P1 BRA 0xa0 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   LDL.64 R40, [R1+0x8] ;
        /*00b0*/                   EXIT ;
		Function : kernel_b
        /*0000*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;
        /*0010*/                   CALL.REL.NOINC 0x50 ;
        /*0020*/                   STSM.16.M88.4 [R185], R8 ;
        /*0030*/                   IMAD.WIDE.U32 R20, R3, 0x4, R4 ;
        /*0040*/                   EXIT ;
        /*0050*/                   MOV R230, R2 ;
        /*0060*/                   RET.REL.NODEC R20 0x0 ;
"""


def test_each_role_gets_its_reachable_code_registers_and_spills():
    code = sass_regions.functions(LISTING)["kernel_a"]
    gemm, gather = sass_regions.report(code)
    # GEMM: the HGMMA's 32 accumulator registers from R152 reach R183, LDS.128 at R200 reaches R203
    assert "setmaxnreg 232: 4 instructions, up to R203 OK, 0 spill" in gemm
    assert gemm.endswith("first HGMMA 1 instructions in")  # the once-a-CTA code before the first GEMM
    # gather: its branch target is reachable; LDL.64 at R40 touches R41, above the 40 allowed
    assert "setmaxnreg 40: 6 instructions, up to R41 ABOVE setmaxnreg 40, 2 spill" in gather


def test_call_targets_and_wide_operands_count():
    (gemm,) = sass_regions.report(sass_regions.functions(LISTING)["kernel_b"])
    # R230 is named only in the routine the role calls
    assert "setmaxnreg 232: 7 instructions, up to R230 OK, 0 spill" in gemm
    # stmatrix.x4 / ldmatrix.x4 take four registers from their data operand's base; the shared
    # address is one register
    assert sass_regions.highest_register("STSM.16.M88.4 [R185], R8") == 185
    assert sass_regions.highest_register("STSM.16.M88.4 [R5], R8") == 11
    assert sass_regions.highest_register("LDSM.16.M88.4 R200, [R5]") == 203
    assert sass_regions.highest_register("LDSM.16.M88.4 R8, [R185]") == 185
    assert sass_regions.highest_register("IMAD.WIDE.U32 R20, R3, 0x4, R4") == 21
    assert sass_regions.highest_register("HGMMA.64x256x16.F32.BF16 R24, R200, gdesc[UR4], R24") == 203
