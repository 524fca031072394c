"""Merges the partials of the persistent kernel's row blocks (persistent_schedule.py).

Program (k, g) reads the schedule plan that the kernel read (cutlass_kernels/verify_plan.cuh)
and merges rows [16 g, 16 g + 16) of at most one row block, 4 at a time: with equal shares, the
row block that CTA k's share begins in (a binary search of the plan's first items), if that boundary cuts it and
is its first cut; with pieces, row block k, if it has more than one split. Every other program
does nothing, and ends without waiting for the attention kernel, so that where nothing is cut
(pieces of one split) the grid costs little more than one program that waits. The grid is
(CTAs, 4), a function of the GPU only.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ...contract import (LATENT_DIM, PLAN_BLOCK, PLAN_CTAS, PLAN_EQUAL_SHARES, PLAN_FIRST_ITEM, PLAN_HEADER, PLAN_HEADS,
                         PLAN_ITEMS, PLAN_REQUEST, PLAN_ROW_BLOCKS, PLAN_SPLITS, PLAN_UNITS, PLAN_USED, ROWS_PER_BLOCK,
                         plan_capacity)
from ..splits import dependent_launch

# A program merges 4 rows from 4 slots per memory round trip ([4, 4, 512] fp32: 32 per thread of
# 8 warps): equal shares rarely cut a row block more than 3 times. One row per program needs 64
# programs per row block, whose registers leave room for few programs per SM (docs/kernel-log.md, v8).
# It takes ROW_GROUPS such groups of rows one after another, so that the plan is searched once for
# them: a quarter of the programs, which start only as the kernel's CTAs leave, about two an SM
# (-9 µs on H16_n16_B32_P8192_ragged; most of the merge's ~50 µs after the kernel is elsewhere,
# docs/kernel-log.md, "cg").
SLOT_BLOCK = 4
ROWS_PER_PROGRAM = 4
ROW_GROUPS = 4

# The plan's layout, as the kernel's constants.
_HEADER, _EQUAL_SHARES, _ROW_BLOCKS, _ITEMS, _USED = (tl.constexpr(v) for v in (PLAN_HEADER, PLAN_EQUAL_SHARES, PLAN_ROW_BLOCKS,
                                                                               PLAN_ITEMS, PLAN_USED))
_HEADS, _CTAS, _SPLITS = (tl.constexpr(v) for v in (PLAN_HEADS, PLAN_CTAS, PLAN_SPLITS))
_REQUEST, _BLOCK, _UNITS, _FIRST_ITEM = (tl.constexpr(v) for v in (PLAN_REQUEST, PLAN_BLOCK, PLAN_UNITS, PLAN_FIRST_ITEM))


@triton.jit
def _combine_persistent_kernel(
    part_out_ptr, part_lse_ptr, qo_indptr_ptr, plan_ptr, capacity, search_steps, splits,
    out_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh, num_ctas,
    HEADS: tl.constexpr, SLOT_BLOCK: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    ROWS: tl.constexpr, D: tl.constexpr, DEPENDENT: tl.constexpr, ROW_GROUPS: tl.constexpr,
):
    # Launched while the attention kernel may still run. The plan and qo_indptr were written before
    # it began (that kernel waits for the preparation before it lets this grid launch), so they are
    # read first; only a program with rows to merge waits for the kernel's partials, and program
    # (0, 0) waits too, so that this grid cannot end before the kernel does.
    k = tl.program_id(0)
    g = tl.program_id(1)
    # A plan made for another schedule is not read (the kernel wrote nothing from it either).
    made_for = ((tl.load(plan_ptr + _HEADS) == HEADS) & (tl.load(plan_ptr + _CTAS) == num_ctas)
                & (tl.load(plan_ptr + _SPLITS) == splits))
    equal = made_for & (tl.load(plan_ptr + _EQUAL_SHARES) != 0)
    row_blocks = tl.where(made_for, tl.load(plan_ptr + _ROW_BLOCKS), 0)
    total = tl.maximum(tl.load(plan_ptr + _ITEMS), 1)
    used = tl.maximum(tl.load(plan_ptr + _USED), 1)
    field = plan_ptr + _HEADER
    # Equal shares: the row block that holds x, the first item of CTA k's share: the last one
    # whose first item is <= x. With pieces nothing of it is loaded (its loads are masked), so a
    # program with nothing to merge ends one round trip after the kernel before it.
    x = k * total // used
    lo = row_blocks * 0
    hi = row_blocks
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        searching = equal & (lo < hi)
        below = searching & (tl.load(field + _FIRST_ITEM * capacity + tl.minimum(mid, capacity - 1), mask=searching,
                                     other=0) <= x)
        hi = tl.where(searching & ~below, mid, hi)
        lo = tl.where(below, mid + 1, lo)
    r_equal = tl.maximum(lo - 1, 0)
    first = tl.load(field + _FIRST_ITEM * capacity + r_equal, mask=equal, other=0)  # the first item of that row block
    u = tl.maximum(tl.load(field + _UNITS * capacity + r_equal, mask=equal, other=1), 1)
    i0 = ((first + 1) * used - 1) // total  # the CTA whose share holds that item
    i1 = ((first + u) * used - 1) // total  # the CTA that holds its last item
    first_slot = 2 * i0 + tl.where(i0 * total // used == first, 0, 1)
    cut_here = equal & (k > 0) & (k < used) & (first != x) & (k == i0 + 1)
    # Pieces: row block k.
    pieces_here = ~equal & (splits > 1) & (k < row_blocks)
    here = cut_here | pieces_here
    r = tl.where(equal, r_equal, tl.minimum(k, capacity - 1))
    b = tl.load(field + _REQUEST * capacity + r, mask=here, other=0)
    block = tl.load(field + _BLOCK * capacity + r, mask=here, other=0)
    qo_lo = tl.load(qo_indptr_ptr + b, mask=here, other=0).to(tl.int64)
    request_rows = (tl.load(qo_indptr_ptr + b + 1, mask=here, other=0).to(tl.int64) - qo_lo) * HEADS

    rows_of_program = g * ROW_GROUPS * ROWS_PER_PROGRAM  # its first row of the row block
    if DEPENDENT:
        if (here & (block * ROWS + rows_of_program < request_rows)) | ((k == 0) & (g == 0)):
            gdc_wait()
    count = tl.where(equal, i1 - i0 + 1, splits)
    d = tl.arange(0, D)
    for group in range(ROW_GROUPS):
        rr = rows_of_program + group * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)  # rows of the row block
        row = block * ROWS + rr  # rows of the request
        row_ok = row < request_rows
        if here & (tl.sum(row_ok.to(tl.int32), 0) > 0):
            m_run = tl.full([ROWS_PER_PROGRAM], float("-inf"), tl.float32)
            total_weight = tl.zeros([ROWS_PER_PROGRAM], tl.float32)
            acc = tl.zeros([ROWS_PER_PROGRAM, D], tl.float32)
            # The LSEs and partials of a block of slots are loaded together (one memory round trip),
            # merged into a running maximum per row.
            for c0 in range(0, count, SLOT_BLOCK):
                kk = c0 + tl.arange(0, SLOT_BLOCK)
                slot = tl.where(equal, tl.where(kk == 0, first_slot, 2 * (i0 + kk)), k * splits + kk)
                ok = (kk < count)[:, None] & row_ok[None, :]  # [slots, rows]
                at = slot[:, None] * ROWS + rr[None, :]
                lse_k = tl.load(part_lse_ptr + at, mask=ok, other=float("-inf"))
                part = tl.load(part_out_ptr + at[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0)
                m_new = tl.maximum(m_run, tl.max(lse_k, 0))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                scale = tl.exp(m_run - m_safe)
                weight = tl.exp(lse_k - m_safe[None, :])  # 0 for a slot that saw no key; its bytes are not trusted
                acc = acc * scale[:, None] + tl.sum(tl.where((weight > 0)[:, :, None], weight[:, :, None] * part, 0.0), 0)
                total_weight = total_weight * scale + tl.sum(weight, 0)
                m_run = m_new
            saw_any = total_weight > 0.0
            o = acc / tl.where(saw_any, total_weight, 1.0)[:, None]
            m_final = tl.where(m_run == float("-inf"), 0.0, m_run)
            t = qo_lo + row // HEADS
            h = row % HEADS
            tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :], o.to(out_ptr.dtype.element_ty),
                     mask=row_ok[:, None])
            tl.store(lse_ptr + t * stride_lt + h * stride_lh,
                     tl.where(saw_any, m_final + tl.log(tl.where(saw_any, total_weight, 1.0)), float("-inf")), mask=row_ok)


def combine_persistent(part_out, part_lse, qo_indptr, plan, out, lse, ctas: int, splits: int):
    """out/lse of the row blocks that the persistent kernel over `ctas` CTAs (pieces schedule:
    `splits` per row block) wrote as partials ([2 ctas, 64, 512] and [2 ctas, 64] float32), as
    the schedule plan it read (int64, cutlass_kernels/verify_plan.cuh) says."""
    capacity = plan_capacity(out.shape[0], out.shape[1], qo_indptr.numel() - 1)
    dependent = dependent_launch(out.device)
    _combine_persistent_kernel[(ctas, ROWS_PER_BLOCK // (ROWS_PER_PROGRAM * ROW_GROUPS))](
        part_out, part_lse, qo_indptr, plan, capacity, max(capacity, 1).bit_length(), splits,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1), ctas,
        HEADS=out.shape[1], SLOT_BLOCK=SLOT_BLOCK, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM,
        ROWS=ROWS_PER_BLOCK, D=LATENT_DIM, DEPENDENT=dependent, ROW_GROUPS=ROW_GROUPS, num_warps=8, launch_pdl=dependent,
    )
