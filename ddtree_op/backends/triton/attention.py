"""Triton fallback of the attention op over combined indices (any CUDA GPU Triton supports).

Structure (docs/kernel-design.md): a program owns BLOCK_M packed (draft row, head) rows of one
request, so every gathered 576-wide KV row is loaded once for all of them. The request's keys
are [prefix ‖ drafts] through `verify_indices`; the prefix loop needs no mask, the draft loop
reads one 64-bit mask word per (row, column). The key range can be split across programs
(NUM_SPLITS, chosen from shapes only); the shared combine (backends/lse_merge.py) merges the
partials by LSE.

Grid, workspace and launch depend on tensor shapes only: each program finds its request from
qo_indptr on the device, so the launch replays under CUDA graphs with new lengths.

With a status, the last program of split 0 (always one past the requests' row blocks: it has at
most padding rows to write) publishes what the preparation before the launch left in the
status's keys (cutlass_kernels/status.cuh).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...contract import KEY_TILE, LATENT_DIM, ROPE_DIM, ROWS_PER_BLOCK
from ...status import NUM_FAULTS, key_word
from ..lse_merge import combine_splits
from ..splits import sm_count
from .schedule import num_kv_splits

LOG2E = 1.4426950408889634
D_LATENT = tl.constexpr(LATENT_DIM)
D_ROPE = tl.constexpr(ROPE_DIM)


@triton.jit
def _attend_tile(
    m_i, l_i, acc, q_latent, q_rope, kv_ptr, stride_kv, verify_indices_ptr, kv_lo,
    kv0, kv_end, prefix_len, mask_row_ptr, row_ok, scale_log2, dv0,
    IS_DRAFT: tl.constexpr, BLOCK_N: tl.constexpr, DV: tl.constexpr,
):
    cols = kv0 + tl.arange(0, BLOCK_N)
    col_ok = cols < kv_end
    slot = tl.load(verify_indices_ptr + kv_lo + cols, mask=col_ok, other=-1).to(tl.int64)
    key_ok = col_ok & (slot >= 0)  # slot -1 (sanitized by the preparation): an invisible key, never read
    key_row = kv_ptr + tl.where(key_ok, slot, 0) * stride_kv
    # An FP8 cache is widened to q's dtype in registers (exact); its scale is applied outside.
    k_latent = tl.load(key_row[:, None] + tl.arange(0, D_LATENT)[None, :], mask=key_ok[:, None], other=0.0)
    k_latent = k_latent.to(q_latent.dtype)
    k_rope = tl.load(key_row[:, None] + D_LATENT + tl.arange(0, D_ROPE)[None, :], mask=key_ok[:, None], other=0.0)
    k_rope = k_rope.to(q_rope.dtype)
    scores = tl.dot(q_latent, tl.trans(k_latent))
    scores = tl.dot(q_rope, tl.trans(k_rope), scores)
    scores = scores * scale_log2
    visible = key_ok[None, :]
    if IS_DRAFT:
        draft_col = cols - prefix_len
        word = tl.load(mask_row_ptr[:, None] + (draft_col // 64)[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0)
        visible = visible & (((word >> (draft_col % 64)[None, :].to(tl.int64)) & 1) != 0)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at 0
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DV == D_LATENT:
        values = k_latent
    else:  # this program owns output columns dv0 .. dv0 + DV (a re-read that hits L1/L2)
        values = tl.load(key_row[:, None] + dv0 + tl.arange(0, DV)[None, :], mask=key_ok[:, None], other=0.0)
        values = values.to(q_latent.dtype)
    acc = tl.dot(p.to(values.dtype), values, acc)
    return m_new, l_i, acc


@triton.jit
def _publish_status(status_ptr, key_word, NUM_KINDS: tl.constexpr):
    """status[0:16) from the keys at word `key_word` (~(position << 32 | uint32(value)) per kind,
    0: none), then the keys and the ticket cleared (cutlass_kernels/status.cuh, publish_status)."""
    LANES: tl.constexpr = 16
    k = tl.arange(0, LANES)
    kind_ok = k < NUM_KINDS
    low = tl.load(status_ptr + key_word + 2 * k, mask=kind_ok, other=0)
    high = tl.load(status_ptr + key_word + 2 * k + 1, mask=kind_ok, other=0)
    present = high != 0
    positions = tl.where(present, high ^ -1, -1)
    values = low ^ -1
    bits = tl.sum(present.to(tl.int32) << k, 0)
    kind = tl.min(tl.where(present, k, LANES), 0)
    found = kind < LANES
    position = tl.sum(tl.where(k == kind, positions, 0), 0)
    value = tl.sum(tl.where(k == kind, values, 0), 0)
    head = tl.where(k == 0, bits, tl.where(k == 1, tl.where(found, kind, -1), tl.where(k == 2, tl.where(found, position, -1),
                                                                                        value)))
    tl.store(status_ptr + k, head, mask=k < 4)
    tl.store(status_ptr + 4 + k, positions, mask=kind_ok)
    tl.debug_barrier()  # every thread has read the keys before any clears them
    tl.store(status_ptr + key_word + 2 * k, tl.zeros([LANES], tl.int32), mask=k <= NUM_KINDS)
    tl.store(status_ptr + key_word + 2 * k + 1, tl.zeros([LANES], tl.int32), mask=k <= NUM_KINDS)


@triton.jit
def _tree_attention_kernel(
    q_ptr, stride_qt, stride_qh,
    kv_ptr, stride_kv,
    qo_indptr_ptr, verify_indptr_ptr, verify_indices_ptr,
    mask_ptr, stride_mask,
    out_ptr, stride_ot, stride_oh,
    lse_ptr, stride_lt, stride_lh,
    part_out_ptr, part_lse_ptr,
    num_tokens, batch, scale_log2, kv_scale_ptr, kv_scale_value, status_ptr, status_key_word,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BATCH_POW2: tl.constexpr, NUM_SPLITS: tl.constexpr, DV_PARTS: tl.constexpr, SCALE_FROM_PTR: tl.constexpr,
    HAS_STATUS: tl.constexpr, STATUS_KINDS: tl.constexpr,
):
    DV: tl.constexpr = D_LATENT // DV_PARTS
    # The per-tensor KV scale s (value = stored * s) is exact to apply outside the dots: scores
    # are sm_scale * s * (q . stored), and out = s * (softmax . stored V).
    if SCALE_FROM_PTR:
        kv_scale = tl.load(kv_scale_ptr).to(tl.float32)  # read on the device: may change between graph replays
    else:
        kv_scale = kv_scale_value
    scale_log2 = scale_log2 * kv_scale
    pid_block = tl.program_id(0)
    pid_split = tl.program_id(1) // DV_PARTS
    pid_dv = tl.program_id(1) % DV_PARTS
    dv0 = pid_dv * DV
    if HAS_STATUS:
        if (pid_block == tl.num_programs(0) - 1) & (tl.program_id(1) == 0):
            _publish_status(status_ptr, status_key_word, STATUS_KINDS)

    # Device-side schedule: request b owns ceil(n_b * H / BLOCK_M) consecutive row blocks.
    req = tl.arange(0, BATCH_POW2)
    in_batch = req < batch
    row_lo = tl.load(qo_indptr_ptr + req, mask=in_batch, other=0)
    row_hi = tl.load(qo_indptr_ptr + req + 1, mask=in_batch, other=0)
    blocks = (((row_hi - row_lo) * HEADS + BLOCK_M - 1) // BLOCK_M).to(tl.int32)
    blocks_end = tl.cumsum(blocks, 0)
    total_blocks = tl.sum(blocks, 0)
    r = tl.arange(0, BLOCK_M)
    dv = tl.arange(0, D_LATENT)

    if pid_block >= total_blocks:
        # Leftover programs zero the padding rows t >= qo_indptr[B] (out 0, lse -inf).
        if (pid_split == 0) & (pid_dv == 0):
            pad_row = tl.load(qo_indptr_ptr + batch).to(tl.int64) * HEADS + (pid_block - total_blocks) * BLOCK_M + r
            pad_ok = pad_row < num_tokens * HEADS
            t = pad_row // HEADS
            h = pad_row % HEADS
            tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + dv[None, :],
                     tl.zeros([BLOCK_M, D_LATENT], out_ptr.dtype.element_ty), mask=pad_ok[:, None])
            tl.store(lse_ptr + t * stride_lt + h * stride_lh, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=pad_ok)
    else:
        b = tl.sum((blocks_end <= pid_block).to(tl.int32), 0)
        first_block = tl.sum(tl.where(req < b, blocks, 0), 0)
        q_lo = tl.load(qo_indptr_ptr + b).to(tl.int64)
        num_draft = tl.load(qo_indptr_ptr + b + 1).to(tl.int64) - q_lo
        kv_lo = tl.load(verify_indptr_ptr + b)
        kv_len = tl.load(verify_indptr_ptr + b + 1) - kv_lo
        prefix_len = kv_len - num_draft.to(tl.int32)

        row = (pid_block - first_block) * BLOCK_M + r
        row_ok = row < num_draft * HEADS
        t = q_lo + row // HEADS
        h = row % HEADS
        q_row = q_ptr + t * stride_qt + h * stride_qh
        q_latent = tl.load(q_row[:, None] + dv[None, :], mask=row_ok[:, None], other=0.0)
        q_rope = tl.load(q_row[:, None] + D_LATENT + tl.arange(0, D_ROPE)[None, :], mask=row_ok[:, None], other=0.0)
        mask_row_ptr = mask_ptr + t * stride_mask

        chunk = ((kv_len + NUM_SPLITS - 1) // NUM_SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        kv_start = pid_split * chunk
        kv_end = tl.minimum(kv_len, kv_start + chunk)
        prefix_end = tl.minimum(kv_end, prefix_len)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DV], tl.float32)
        for kv0 in range(kv_start, prefix_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(m_i, l_i, acc, q_latent, q_rope, kv_ptr, stride_kv, verify_indices_ptr, kv_lo,
                                         kv0, prefix_end, prefix_len, mask_row_ptr, row_ok, scale_log2, dv0, False, BLOCK_N, DV)
        for kv0 in range(tl.maximum(kv_start, prefix_len), kv_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(m_i, l_i, acc, q_latent, q_rope, kv_ptr, stride_kv, verify_indices_ptr, kv_lo,
                                         kv0, kv_end, prefix_len, mask_row_ptr, row_ok, scale_log2, dv0, True, BLOCK_N, DV)

        saw_any = l_i > 0.0
        o = acc * (kv_scale / tl.where(saw_any, l_i, 1.0))[:, None]
        lse = tl.where(saw_any, (m_i + tl.log2(tl.where(saw_any, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        cols = dv0 + tl.arange(0, DV)
        if NUM_SPLITS == 1:
            tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + cols[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
            tl.store(lse_ptr + t * stride_lt + h * stride_lh, lse, mask=row_ok & (pid_dv == 0))
        else:
            flat = pid_split * num_tokens * HEADS + t * HEADS + h
            tl.store(part_out_ptr + flat[:, None] * D_LATENT + cols[None, :], o, mask=row_ok[:, None])
            tl.store(part_lse_ptr + flat, lse, mask=row_ok & (pid_dv == 0))


# Tile configuration; tuned on the H200 (docs/kernel-log.md).
BLOCK_M = ROWS_PER_BLOCK
BLOCK_N = KEY_TILE
NUM_WARPS = 8
NUM_STAGES = 1
DV_PARTS = 1


def tree_attention_triton(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse,
                          block_m=BLOCK_M, block_n=BLOCK_N, num_warps=NUM_WARPS, num_stages=NUM_STAGES, num_splits=None,
                          dv_parts=DV_PARTS, kv_scale=None, kv_scale_value=1.0, status=None):
    """kv_cache may be float8_e4m3fn (rows widened to q's dtype in registers); its scale is the
    float32 tensor kv_scale (one element, read on the device) or else the float kv_scale_value.
    status: published by the launch (what prepare_verify with publish_status=False left in it),
    where q has rows; with none nothing is launched and the caller publishes."""
    num_tokens, heads = q.shape[0], q.shape[1]
    batch = qo_indptr.numel() - 1
    if num_tokens == 0:
        return
    if num_splits is None:
        num_splits = num_kv_splits(num_tokens, heads, batch, verify_indices.numel(), sm_count(q.device), block_m)
    # Enough programs for every request's row blocks plus the padding rows.
    grid_blocks = math.ceil(num_tokens * heads / block_m) + batch + 1
    if num_splits > 1:
        part_out = torch.empty((num_splits, num_tokens * heads, D_LATENT), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, num_tokens * heads), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = lse  # unused by the kernel when NUM_SPLITS == 1
    kernel = _tree_attention_kernel[(grid_blocks, num_splits * dv_parts)](
        q, q.stride(0), q.stride(1),
        kv_cache, kv_cache.stride(0),
        qo_indptr, verify_indptr, verify_indices,
        mask_words, mask_words.stride(0),
        out, out.stride(0), out.stride(1),
        lse, lse.stride(0), lse.stride(1),
        part_out, part_lse,
        num_tokens, batch, sm_scale * LOG2E, lse if kv_scale is None else kv_scale, float(kv_scale_value),
        qo_indptr if status is None else status, 0 if status is None else key_word(status),
        HEADS=heads, BLOCK_M=block_m, BLOCK_N=block_n,
        BATCH_POW2=triton.next_power_of_2(max(batch, 1)), NUM_SPLITS=num_splits, DV_PARTS=dv_parts,
        SCALE_FROM_PTR=kv_scale is not None, HAS_STATUS=status is not None, STATUS_KINDS=NUM_FAULTS,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        combine_splits(part_out, part_lse, qo_indptr, out, lse)
    return kernel
