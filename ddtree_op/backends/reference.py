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
    """Writes out [T_pad, H, 512] (dtype of q) and lse [T_pad, H] float32 in place.

    An FP8 cache holds stored values: keys are stored x kv_scale (the float32 tensor, else
    kv_scale_value), dequantized as they are gathered, never the whole cache.

    Reads only inside its tensors and sizes every temporary from shapes, whatever the values (the
    preparation hands it sanitized ones): row and key ranges are clamped into their tensors, a
    request whose keys are fewer than its drafts or whose drafts outnumber the mask's columns sees
    nothing, and a slot outside [0, S) (the preparation's -1) is an invisible key."""
    scale = kv_scale.float().reshape(()) if kv_scale is not None else kv_scale_value
    out.zero_()
    lse.fill_(float("-inf"))
    num_tokens, num_keys, num_slots = q.shape[0], verify_indices.numel(), kv_cache.shape[0]
    mask_cols = mask_words.shape[1] * MASK_WORD_BITS
    qo = qo_indptr.tolist()
    vi = verify_indptr.tolist()
    row_end = key_end = 0
    for b in range(min(len(qo), len(vi)) - 1):
        row0 = min(max(qo[b], row_end), num_tokens)
        row_end = min(max(qo[b + 1], row0), num_tokens)
        key0 = min(max(vi[b], key_end), num_keys)
        key_end = min(max(vi[b + 1], key0), num_keys)
        num_draft = row_end - row0
        if num_draft == 0 or key_end - key0 < num_draft or num_draft > mask_cols:
            continue
        slots = verify_indices[key0:key_end].long()
        usable = (slots >= 0) & (slots < num_slots)
        keys = kv_cache[torch.where(usable, slots, torch.zeros_like(slots))].float() * scale  # [L, 576]
        prefix_len = keys.shape[0] - num_draft
        queries = q[row0:row_end].float()  # [n, H, 576]
        scores = torch.einsum("nhd,ld->nhl", queries, keys) * sm_scale
        visible = usable[None, :].repeat(num_draft, 1)
        visible[:, prefix_len:] &= mask_words_to_bits(mask_words[row0:row_end], num_draft)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf where nothing is visible
        safe_lse = torch.where(torch.isinf(row_lse), torch.zeros_like(row_lse), row_lse)
        probs = torch.exp(scores - safe_lse[..., None])  # exactly 0 on masked keys
        out[row0:row_end] = torch.einsum("nhl,lv->nhv", probs, keys[:, :LATENT_DIM]).to(out.dtype)
        lse[row0:row_end] = row_lse
