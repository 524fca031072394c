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
    HEADS: tl.constexpr, BLOCK_D: tl.constexpr, EAGER: tl.constexpr, EAGER_POW2: tl.constexpr,
    LATE: tl.constexpr, LATE_POW2: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Merges the partial (out, lse) pairs of one valid row by their LSE; program (r, j) does row
    r, columns [j * BLOCK_D, +BLOCK_D). The EAGER first slots are loaded at once as one
    [EAGER_POW2, BLOCK_D] tile (a loop over the slots would wait once per slot), and no load of
    theirs waits for another: the row count, the LSEs and the partials go out together, so a
    program waits for one memory round trip. The LATE slots after them may never have been
    written (their LSE is -inf then): their partials are loaded only where the LSE is live, a
    second round trip, and a row with no live late slot skips their loads and sums entirely.
    Rows past qo_indptr[B] are read (the grid covers T * H rows, all inside the buffers) but not
    stored."""
    if DEPENDENT:  # launched while the attention kernel may still run: wait for its partials
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    stride_split = num_tokens * HEADS
    dv = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    valid_rows = tl.load(qo_indptr_ptr + batch).to(tl.int64) * HEADS
    eager = tl.arange(0, EAGER_POW2)
    lse_eager = tl.load(part_lse_ptr + eager * stride_split + row, mask=eager < EAGER, other=float("-inf"))
    part_eager = tl.load(part_out_ptr + (eager * stride_split + row)[:, None] * D_LATENT + dv[None, :],
                         mask=(eager < EAGER)[:, None], other=0.0)
    lse_max = tl.max(lse_eager, axis=0)
    if LATE > 0:
        late = EAGER + tl.arange(0, LATE_POW2)
        lse_late = tl.load(part_lse_ptr + late * stride_split + row, mask=late < EAGER + LATE, other=float("-inf"))
        late_max = tl.max(lse_late, axis=0)
        lse_max = tl.maximum(lse_max, late_max)
    lse_max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    # A slot that saw no key has weight 0; its partial is not trusted to be finite.
    weight = tl.exp(lse_eager - lse_max_safe)
    total = tl.sum(weight, axis=0)
    acc = tl.sum(tl.where((weight > 0)[:, None], weight[:, None] * part_eager, 0.0), axis=0)
    if LATE > 0:
        if late_max > float("-inf"):  # a row without late partials issues none of their work
            weight_late = tl.exp(lse_late - lse_max_safe)
            part_late = tl.load(part_out_ptr + (late * stride_split + row)[:, None] * D_LATENT + dv[None, :],
                                mask=(weight_late > 0)[:, None], other=0.0)
            total += tl.sum(weight_late, axis=0)
            acc += tl.sum(weight_late[:, None] * part_late, axis=0)
    saw_any = total > 0.0
    o = acc / tl.where(saw_any, total, 1.0)
    t = row // HEADS
    h = row % HEADS
    if row < valid_rows:
        tl.store(out_ptr + t * stride_ot + h * stride_oh + dv, o.to(out_ptr.dtype.element_ty))
        if pid_d == 0:
            lse = tl.where(saw_any, lse_max_safe + tl.log(tl.where(saw_any, total, 1.0)), float("-inf"))
            tl.store(lse_ptr + t * stride_lt + h * stride_lh, lse)


def combine_splits(part_out, part_lse, qo_indptr, out, lse, eager_slots: int | None = None):
    """out/lse of the valid rows from partials in slots ([S, T*H, 512] and [S, T*H] float32).
    eager_slots (default: all S): the slots read together with their LSEs; a slot after them may
    hold no partial at all where its LSE is -inf, and is read only where it is not."""
    num_tokens, heads = out.shape[0], out.shape[1]
    num_slots = part_out.shape[0]
    eager = num_slots if eager_slots is None else min(eager_slots, num_slots)
    late = num_slots - eager
    eager_pow2 = triton.next_power_of_2(eager)
    block_d = max(32, min(LATENT_DIM, 4096 // eager_pow2))  # the [slots, BLOCK_D] tile: <= 32 fp32 per thread
    dependent = dependent_launch(out.device)
    _combine_splits_kernel[(num_tokens * heads, LATENT_DIM // block_d)](
        part_out, part_lse, qo_indptr, qo_indptr.numel() - 1,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1),
        num_tokens,
        HEADS=heads, BLOCK_D=block_d, EAGER=eager, EAGER_POW2=eager_pow2, LATE=late,
        LATE_POW2=triton.next_power_of_2(max(late, 1)), DEPENDENT=dependent, num_warps=4,
        launch_pdl=dependent,
    )
