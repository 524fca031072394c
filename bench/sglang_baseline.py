"""An SGLang-style Triton baseline, written from the published structure of SGLang's
`extend_attention_fwd` (target-verify path): one program per (request, head, 32-row draft
tile); each program streams the request's whole prefix for its own head, then the draft block
under the FULL tree mask. 8 warps, BLOCK_N 64. For the benchmark only: it is what users run
today, not an implementation choice of ddtree_op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _baseline_kernel(
    q_ptr, stride_qt, stride_qh,
    kv_ptr, stride_kv,
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, out_cache_loc_ptr,
    mask_ptr, mask_indptr_ptr,
    out_ptr, stride_ot, stride_oh,
    sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_LATENT: tl.constexpr, D_ROPE: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_lo = tl.load(qo_indptr_ptr + b)
    n = tl.load(qo_indptr_ptr + b + 1) - q_lo
    kv_lo = tl.load(kv_indptr_ptr + b)
    prefix_len = tl.load(kv_indptr_ptr + b + 1) - kv_lo
    mask_lo = tl.load(mask_indptr_ptr + b)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n
    dv = tl.arange(0, D_LATENT)
    dr = tl.arange(0, D_ROPE)
    if tile * BLOCK_M < n:
        q_row = q_ptr + (q_lo + rows).to(tl.int64) * stride_qt + h * stride_qh
        q_latent = tl.load(q_row[:, None] + dv[None, :], mask=row_ok[:, None], other=0.0)
        q_rope = tl.load(q_row[:, None] + D_LATENT + dr[None, :], mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_LATENT], tl.float32)
        # Stage 1: the prefix, unmasked.
        for start in range(0, prefix_len, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < prefix_len
            slot = tl.load(kv_indices_ptr + kv_lo + cols, mask=col_ok, other=0).to(tl.int64)
            k_latent = tl.load(kv_ptr + slot[:, None] * stride_kv + dv[None, :], mask=col_ok[:, None], other=0.0)
            k_rope = tl.load(kv_ptr + slot[:, None] * stride_kv + D_LATENT + dr[None, :], mask=col_ok[:, None], other=0.0)
            qk = (tl.dot(q_latent, tl.trans(k_latent)) + tl.dot(q_rope, tl.trans(k_rope))) * sm_scale
            qk = tl.where(col_ok[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k_latent.dtype), k_latent)
            m_i = m_new
        # Stage 2: the draft block, under the FULL mask (row stride prefix_len + n).
        for start in range(0, n, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < n
            slot = tl.load(out_cache_loc_ptr + q_lo + cols, mask=col_ok, other=0).to(tl.int64)
            k_latent = tl.load(kv_ptr + slot[:, None] * stride_kv + dv[None, :], mask=col_ok[:, None], other=0.0)
            k_rope = tl.load(kv_ptr + slot[:, None] * stride_kv + D_LATENT + dr[None, :], mask=col_ok[:, None], other=0.0)
            qk = (tl.dot(q_latent, tl.trans(k_latent)) + tl.dot(q_rope, tl.trans(k_rope))) * sm_scale
            seen = tl.load(mask_ptr + mask_lo + rows[:, None].to(tl.int64) * (prefix_len + n) + prefix_len + cols[None, :],
                           mask=row_ok[:, None] & col_ok[None, :], other=0)
            qk = tl.where((seen != 0) & col_ok[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(qk - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k_latent.dtype), k_latent)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out_row = out_ptr + (q_lo + rows).to(tl.int64) * stride_ot + h * stride_oh
        tl.store(out_row[:, None] + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def sglang_style_verify(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, sm_scale, max_draft_len, out):
    """out[t, h] for SGLang's FULL-mask verify inputs; grid from shapes and `max_draft_len`."""
    kv = kv_cache.reshape(kv_cache.shape[0], -1) if kv_cache.dim() == 3 else kv_cache
    batch, heads = qo_indptr.numel() - 1, q.shape[1]
    block_m, block_n = 32, 64
    grid = (batch, heads, triton.cdiv(max_draft_len, block_m))
    _baseline_kernel[grid](
        q, q.stride(0), q.stride(1), kv, kv.stride(0),
        qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask.view(torch.uint8) if tree_mask.dtype == torch.bool else tree_mask, mask_indptr,
        out, out.stride(0), out.stride(1), sm_scale,
        BLOCK_M=block_m, BLOCK_N=block_n, D_LATENT=512, D_ROPE=64, num_warps=8, num_stages=1,
    )
    return out
