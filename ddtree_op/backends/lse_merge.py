"""The LSE merge of split partials, shared by the CUDA backends' split schedules.

A row's keys were split into NUM_SPLITS ranges, each written as an fp32 partial (o_s, lse_s);
out = Σ_s exp(lse_s − lse) · o_s and lse = log Σ_s exp(lse_s). Partials are laid out
[splits, T * H, 512] and [splits, T * H] (row = token * H + head), as both kernels write them.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..contract import LATENT_DIM
from .splits import dependent_launch

D_LATENT = tl.constexpr(LATENT_DIM)


@triton.jit
def _combine_splits_kernel(
    part_out_ptr, part_lse_ptr, qo_indptr_ptr, batch,
    out_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh,
    num_tokens,
    HEADS: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr,
    LIVE_SLOTS_ONLY: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Merges the NUM_SPLITS partial (out, lse) pairs of one valid row by their LSE; program
    (r, j) does row r, columns [j * BLOCK_D, +BLOCK_D). All splits are loaded at once as one
    [SPLITS_POW2, BLOCK_D] tile (a loop over the splits would wait once per split), and no
    load waits for another: the row count, the LSEs and the partials go out together, so a program
    waits for one memory round trip. Rows past qo_indptr[B] are read (the grid covers T * H rows,
    all inside the buffers) but not stored."""
    if DEPENDENT:  # launched while the attention kernel may still run: wait for its partials
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    stride_split = num_tokens * HEADS
    split = tl.arange(0, SPLITS_POW2)
    dv = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    real_split = split < NUM_SPLITS
    valid_rows = tl.load(qo_indptr_ptr + batch).to(tl.int64) * HEADS
    part_lse = tl.load(part_lse_ptr + split * stride_split + row, mask=real_split, other=float("-inf"))
    # LIVE_SLOTS_ONLY: slots whose LSE is -inf hold no partial (the sm90 kernel's unused piece
    # slots), so their bytes are not loaded, at the cost of waiting for the LSEs first.
    live = real_split & (part_lse > float("-inf")) if LIVE_SLOTS_ONLY else real_split
    part = tl.load(part_out_ptr + (split * stride_split + row)[:, None] * D_LATENT + dv[None, :],
                   mask=live[:, None], other=0.0)
    lse_max = tl.max(part_lse, axis=0)
    lse_max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.exp(part_lse - lse_max_safe)  # 0 for splits that saw no key (and padding splits)
    total = tl.sum(weight, axis=0)
    # A split that saw no key has weight 0; its partial is not trusted to be finite.
    acc = tl.sum(tl.where((weight > 0)[:, None], weight[:, None] * part, 0.0), axis=0)
    saw_any = total > 0.0
    o = acc / tl.where(saw_any, total, 1.0)
    t = row // HEADS
    h = row % HEADS
    if row < valid_rows:
        tl.store(out_ptr + t * stride_ot + h * stride_oh + dv, o.to(out_ptr.dtype.element_ty))
        if pid_d == 0:
            lse = tl.where(saw_any, lse_max_safe + tl.log(tl.where(saw_any, total, 1.0)), float("-inf"))
            tl.store(lse_ptr + t * stride_lt + h * stride_lh, lse)


def combine_splits(part_out, part_lse, qo_indptr, out, lse, live_slots_only: bool = False):
    """out/lse of the valid rows from per-split partials ([S, T*H, 512] and [S, T*H] float32);
    live_slots_only: a slot whose LSE is -inf may hold no partial at all, so it is not read."""
    num_tokens, heads = out.shape[0], out.shape[1]
    num_splits = part_out.shape[0]
    splits_pow2 = triton.next_power_of_2(num_splits)
    block_d = max(32, min(LATENT_DIM, 4096 // splits_pow2))  # the [splits, BLOCK_D] tile: <= 32 fp32 per thread
    dependent = dependent_launch(out.device)
    _combine_splits_kernel[(num_tokens * heads, LATENT_DIM // block_d)](
        part_out, part_lse, qo_indptr, qo_indptr.numel() - 1,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1),
        num_tokens,
        HEADS=heads, BLOCK_D=block_d, NUM_SPLITS=num_splits, SPLITS_POW2=splits_pow2, LIVE_SLOTS_ONLY=live_slots_only,
        DEPENDENT=dependent, num_warps=4,
        launch_pdl=dependent,
    )
