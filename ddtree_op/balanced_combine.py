"""Merges the partials of the row blocks that the balanced schedule cut (balanced_schedule.py).

A row block is cut only where a CTA's share begins inside it, so the combine looks at CTA
boundaries, not at rows: program (k, r) takes the boundary where CTA k's share begins, finds
the row block it falls in, and, if the boundary cuts that row block and is its first cut,
merges row r of it from the slots the formulas name. Every other program does nothing; the grid
is (CTAs, 64), a function of the GPU only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .balanced_schedule import ROWS_PER_BLOCK, UNIT_KEYS

D_LATENT = 512
SLOT_BLOCK = 4  # partial slots loaded at once; a row block is rarely cut more than 3 times


@triton.jit
def _combine_cut_row_blocks_kernel(
    part_out_ptr, part_lse_ptr, qo_indptr_ptr, verify_indptr_ptr, batch,
    out_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh, num_ctas,
    HEADS: tl.constexpr, BATCH_POW2: tl.constexpr, SLOT_BLOCK: tl.constexpr,
    ROWS: tl.constexpr, UNIT: tl.constexpr, D: tl.constexpr,
):
    k = tl.program_id(0)
    r = tl.program_id(1)
    req = tl.arange(0, BATCH_POW2)
    real = req < batch
    qo_lo = tl.load(qo_indptr_ptr + req, mask=real, other=0).to(tl.int64)
    qo_hi = tl.load(qo_indptr_ptr + req + 1, mask=real, other=0).to(tl.int64)
    kv_lo = tl.load(verify_indptr_ptr + req, mask=real, other=0).to(tl.int64)
    kv_hi = tl.load(verify_indptr_ptr + req + 1, mask=real, other=0).to(tl.int64)
    rows = (qo_hi - qo_lo) * HEADS
    units = (kv_hi - kv_lo + UNIT - 1) // UNIT
    items = (rows + ROWS - 1) // ROWS * units
    total = tl.sum(items, 0)
    used = tl.minimum(total, num_ctas)
    if (k > 0) & (k < used):
        x = k * total // used  # the first item of CTA k's share
        b = tl.sum((tl.cumsum(items, 0) <= x).to(tl.int32), 0)  # the request that holds it
        before = tl.sum(tl.where(req < b, items, 0), 0)
        u = tl.sum(tl.where(req == b, units, 0), 0)
        first = before + (x - before) // u * u  # the first item of its row block
        i0 = ((first + 1) * used - 1) // total  # the CTA whose share holds that item
        row = (x - before) // u * ROWS + r
        if (first != x) & (k == i0 + 1) & (row < tl.sum(tl.where(req == b, rows, 0), 0)):
            i1 = ((first + u) * used - 1) // total  # the CTA that holds its last item
            first_slot = 2 * i0 + tl.where(i0 * total // used == first, 0, 1)
            d = tl.arange(0, D)
            m_run = tl.max(tl.full([SLOT_BLOCK], float("-inf"), tl.float32), 0)
            total_weight = tl.sum(tl.zeros([SLOT_BLOCK], tl.float32), 0)
            acc = tl.zeros([D], tl.float32)
            # The LSEs and partials of a block of slots are loaded together (one memory round trip),
            # merged into a running maximum.
            for c0 in range(0, i1 - i0 + 1, SLOT_BLOCK):
                kk = c0 + tl.arange(0, SLOT_BLOCK)
                valid = kk <= i1 - i0
                slot = tl.where(kk == 0, first_slot, 2 * (i0 + kk))
                lse_k = tl.load(part_lse_ptr + slot * ROWS + r, mask=valid, other=float("-inf"))
                part = tl.load(part_out_ptr + (slot * ROWS + r)[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
                m_new = tl.maximum(m_run, tl.max(lse_k, 0))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                scale = tl.exp(m_run - m_safe)
                weight = tl.exp(lse_k - m_safe)  # 0 for a slot that saw no key; its bytes are not trusted
                acc = acc * scale + tl.sum(tl.where((weight > 0)[:, None], weight[:, None] * part, 0.0), 0)
                total_weight = total_weight * scale + tl.sum(weight, 0)
                m_run = m_new
            saw_any = total_weight > 0.0
            o = acc / tl.where(saw_any, total_weight, 1.0)
            m_final = tl.where(m_run == float("-inf"), 0.0, m_run)
            t = tl.sum(tl.where(req == b, qo_lo, 0), 0) + row // HEADS
            h = row % HEADS
            tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))
            tl.store(lse_ptr + t * stride_lt + h * stride_lh,
                     tl.where(saw_any, m_final + tl.log(tl.where(saw_any, total_weight, 1.0)), float("-inf")))


def combine_cut_row_blocks(part_out, part_lse, qo_indptr, verify_indptr, out, lse, ctas: int):
    """out/lse of the cut row blocks from the partials ([2 ctas, 64, 512] and [2 ctas, 64] float32)
    written by the kernel's balanced schedule over `ctas` CTAs."""
    batch = qo_indptr.numel() - 1
    _combine_cut_row_blocks_kernel[(ctas, ROWS_PER_BLOCK)](
        part_out, part_lse, qo_indptr, verify_indptr, batch,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1), ctas,
        HEADS=out.shape[1], BATCH_POW2=triton.next_power_of_2(max(batch, 1)), SLOT_BLOCK=SLOT_BLOCK,
        ROWS=ROWS_PER_BLOCK, UNIT=UNIT_KEYS, D=D_LATENT, num_warps=4,
    )
