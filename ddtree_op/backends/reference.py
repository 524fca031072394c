"""Float32 reference of the attention op over combined indices (the op's CPU implementation).

Plain PyTorch, one request at a time: it reads lengths on the host, so it is the ground truth
for tests and the CPU path, never a CUDA-graph path.
"""

from __future__ import annotations

import torch

from ..contract import LATENT_DIM, MASK_WORD_BITS


def mask_words_to_bits(mask_words: torch.Tensor, num_cols: int) -> torch.Tensor:
    """bool [rows, num_cols]: bit j of the compact mask (word j // 64, bit j % 64)."""
    col = torch.arange(num_cols, device=mask_words.device)
    words = mask_words[:, col // MASK_WORD_BITS]
    return ((words >> (col % MASK_WORD_BITS)) & 1).bool()


def tree_attention_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    verify_indptr: torch.Tensor,
    verify_indices: torch.Tensor,
    mask_words: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_scale: torch.Tensor | None = None,
    kv_scale_value: float = 1.0,
) -> None:
    """Writes out [T_pad, H, 512] (dtype of q) and lse [T_pad, H] float32 in place. An FP8 cache
    holds stored values; the keys are stored x kv_scale (the float32 tensor, else kv_scale_value),
    dequantized row by row as they are gathered, never the whole cache."""
    scale = kv_scale.float().reshape(()) if kv_scale is not None else kv_scale_value
    out.zero_()
    lse.fill_(float("-inf"))
    qo = qo_indptr.tolist()
    vi = verify_indptr.tolist()
    for b in range(len(qo) - 1):
        row0, num_draft = qo[b], qo[b + 1] - qo[b]
        if num_draft == 0:
            continue
        keys = kv_cache[verify_indices[vi[b] : vi[b + 1]].long()].float() * scale  # [L, 576]
        prefix_len = keys.shape[0] - num_draft
        queries = q[row0 : row0 + num_draft].float()  # [n, H, 576]
        scores = torch.einsum("nhd,ld->nhl", queries, keys) * sm_scale
        visible = torch.ones(num_draft, keys.shape[0], dtype=torch.bool, device=q.device)
        visible[:, prefix_len:] = mask_words_to_bits(mask_words[row0 : row0 + num_draft], num_draft)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf where nothing is visible
        safe_lse = torch.where(torch.isinf(row_lse), torch.zeros_like(row_lse), row_lse)
        probs = torch.exp(scores - safe_lse[..., None])  # exactly 0 on masked keys
        out[row0 : row0 + num_draft] = torch.einsum("nhl,lv->nhv", probs, keys[:, :LATENT_DIM]).to(out.dtype)
        lse[row0 : row0 + num_draft] = row_lse
