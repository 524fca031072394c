"""Merges the partials of the persistent kernel's row blocks (persistent_schedule.py).

Program (k, g) makes the same choice as the kernel and then merges rows [4 g, 4 g + 4) of at
most one row block: with equal shares, the row block that CTA k's share begins in, if that
boundary cuts it and is its first cut; with pieces, row block k, if it has more than one split.
Every other program does nothing. The grid is (CTAs, 16), a function of the GPU only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...contract import CUT_COST_UNITS, LATENT_DIM, ROWS_PER_BLOCK, UNIT_KEYS

# A program merges 4 rows from 4 slots per memory round trip ([4, 4, 512] fp32: 32 per thread of
# 8 warps): equal shares rarely cut a row block more than 3 times. One row per program needs 64
# programs per row block, whose registers leave room for few programs per SM (docs/kernel-log.md, v8).
SLOT_BLOCK = 4
ROWS_PER_PROGRAM = 4


@triton.jit
def _combine_persistent_kernel(
    part_out_ptr, part_lse_ptr, qo_indptr_ptr, verify_indptr_ptr, batch, splits,
    out_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh, num_ctas,
    HEADS: tl.constexpr, BATCH_POW2: tl.constexpr, SLOT_BLOCK: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    CUT_COST: tl.constexpr,
    ROWS: tl.constexpr, UNIT: tl.constexpr, D: tl.constexpr,
):
    k = tl.program_id(0)
    g = tl.program_id(1)
    req = tl.arange(0, BATCH_POW2)
    real = req < batch
    qo_lo = tl.load(qo_indptr_ptr + req, mask=real, other=0).to(tl.int64)
    qo_hi = tl.load(qo_indptr_ptr + req + 1, mask=real, other=0).to(tl.int64)
    kv_lo = tl.load(verify_indptr_ptr + req, mask=real, other=0).to(tl.int64)
    kv_hi = tl.load(verify_indptr_ptr + req + 1, mask=real, other=0).to(tl.int64)
    rows = (qo_hi - qo_lo) * HEADS
    blocks = (rows + ROWS - 1) // ROWS
    units = (kv_hi - kv_lo + UNIT - 1) // UNIT
    items = blocks * units
    total = tl.maximum(tl.sum(items, 0), 1)
    all_blocks = tl.sum(blocks, 0)
    used = tl.minimum(total, num_ctas)
    # The kernel's choice (cutlass_kernels/sm90/persistent_plan.cuh: plan_batch).
    longest = tl.max(tl.where(blocks > 0, (units + splits - 1) // splits, 0), 0)
    waves = (all_blocks * splits + num_ctas - 1) // num_ctas
    share = (total + used - 1) // used
    pieces_fit = (splits == 1) | (all_blocks * splits <= 2 * num_ctas)
    pieces = pieces_fit & (share + CUT_COST >= waves * longest)
    equal = (pieces_fit == 0) | (share + CUT_COST < waves * longest)
    # Equal shares: the row block that holds x, the first item of CTA k's share.
    x = k * total // used
    b_eq = tl.sum((tl.cumsum(items, 0) <= x).to(tl.int32), 0)
    before = tl.sum(tl.where(req < b_eq, items, 0), 0)
    u = tl.maximum(tl.sum(tl.where(req == b_eq, units, 0), 0), 1)
    first = before + (x - before) // u * u  # the first item of that row block
    i0 = ((first + 1) * used - 1) // total  # the CTA whose share holds that item
    i1 = ((first + u) * used - 1) // total  # the CTA that holds its last item
    first_slot = 2 * i0 + tl.where(i0 * total // used == first, 0, 1)
    cut_here = equal & (k > 0) & (k < used) & (first != x) & (k == i0 + 1)
    # Pieces: row block k.
    b_pc = tl.sum((tl.cumsum(blocks, 0) <= k).to(tl.int32), 0)
    block_pc = k - tl.sum(tl.where(req < b_pc, blocks, 0), 0)
    pieces_here = pieces & (splits > 1) & (k < all_blocks)

    b = tl.where(equal, b_eq, b_pc)
    rr = g * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)  # rows of the row block
    row = tl.where(equal, (x - before) // u, block_pc) * ROWS + rr  # rows of the request
    row_ok = row < tl.sum(tl.where(req == b, rows, 0), 0)
    if (cut_here | pieces_here) & (tl.sum(row_ok.to(tl.int32), 0) > 0):
        count = tl.where(equal, i1 - i0 + 1, splits)
        d = tl.arange(0, D)
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
        t = tl.sum(tl.where(req == b, qo_lo, 0), 0) + row // HEADS
        h = row % HEADS
        tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        tl.store(lse_ptr + t * stride_lt + h * stride_lh,
                 tl.where(saw_any, m_final + tl.log(tl.where(saw_any, total_weight, 1.0)), float("-inf")), mask=row_ok)


def combine_persistent(part_out, part_lse, qo_indptr, verify_indptr, out, lse, ctas: int, splits: int):
    """out/lse of the row blocks that the persistent kernel over `ctas` CTAs (pieces schedule:
    `splits` per row block) wrote as partials ([2 ctas, 64, 512] and [2 ctas, 64] float32)."""
    batch = qo_indptr.numel() - 1
    _combine_persistent_kernel[(ctas, ROWS_PER_BLOCK // ROWS_PER_PROGRAM)](
        part_out, part_lse, qo_indptr, verify_indptr, batch, splits,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1), ctas,
        HEADS=out.shape[1], BATCH_POW2=triton.next_power_of_2(max(batch, 1)),
        SLOT_BLOCK=SLOT_BLOCK, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM, CUT_COST=CUT_COST_UNITS,
        ROWS=ROWS_PER_BLOCK, UNIT=UNIT_KEYS, D=LATENT_DIM, num_warps=8,
    )
