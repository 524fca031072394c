"""bench/ncu_roles.py on a tiny ncu source-page export (no GPU, no ncu)."""

import csv

from bench import ncu_roles

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
          "stall_barrier", "stall_long_sb (Not Issued)"]
ROWS = [  # offsets from the first instruction: 0x120 is offset 20 below
    ("0x100", "@P0 BRA 0x140", 1, 10, 1, 0, 0),
    ("0x110", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe0", 2, 10, 0, 2, 0),
    ("0x120", "HGMMA.64x64x16.F32.BF16 R152, gdesc[UR24], RZ", 30, 100, 0, 30, 0),
    ("0x130", "EXIT", 0, 10, 0, 0, 0),
    ("0x140", "USETMAXREG.DEALLOC.CTAPOOL 0x38", 1, 5, 1, 0, 0),
    ("0x150", "LDGSTS.E.BYPASS.LTC128B.128 [R2], desc[UR4][R4.64]", 60, 50, 60, 0, 0),
    ("0x160", "EXIT", 0, 5, 0, 0, 0),
]


def test_roles_get_their_samples_and_stall_reasons(tmp_path, capsys):
    path = tmp_path / "sass.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Kernel Name", "kernel"])
        writer.writerow(HEADER)
        writer.writerows(ROWS)
    ncu_roles.main([str(path), "--top", "1", "--ranges", "20-30"])
    out = capsys.readouterr().out
    assert "== GEMM warpgroups: 3 instructions, samples 32 (34.0%)" in out
    assert "== gather: 3 instructions, samples 61 (64.9%)" in out
    assert "stalls: barrier 100.0%" in out  # all 32 of the GEMM code's samples
    assert "== prologue and the rest: 1 instructions, samples 1" in out
    assert "== offsets 20-30: 1 instructions, samples 30" in out
    assert "LDGSTS" in out.split("== gather")[1].split("==")[0]
