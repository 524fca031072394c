"""The sm_90a CuTe/wgmma kernel (cutlass_kernels/sm90/) behind the attention op's "cutlass" backend.

Same contract as the Triton fallback: packed (draft, head) rows, combined indices, compact mask,
shape-only schedule, LSE combine of split partials (the Triton combine kernel).
"""

from __future__ import annotations

import torch

from . import build
from .schedule import num_kv_splits_whole_tiles, sm_count

ROWS_PER_CTA = 64
CTAS_PER_SM = 1  # 216 KB of shared memory per CTA
# The kernel's splits hold whole pairs of 64-key tiles. Short splits pay off: one CTA's fixed cost
# (index loads, first copies, epilogue) is a few microseconds, and partials of 64 rows are small.
KEYS_PER_SPLIT = 128
MAX_SPLITS = 128


def tree_attention_sm90(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, num_splits=None):
    build.load_library("sm90")
    num_tokens, heads = q.shape[0], q.shape[1]
    if num_tokens == 0:
        return
    batch = qo_indptr.numel() - 1
    if num_splits is None:
        num_splits = num_kv_splits_whole_tiles(num_tokens, heads, batch, verify_indices.numel(), sm_count(q.device),
                                               ROWS_PER_CTA, CTAS_PER_SM, KEYS_PER_SPLIT, MAX_SPLITS)
    if num_splits > 1:
        part_out = torch.empty((num_splits, num_tokens * heads, 512), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, num_tokens * heads), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = torch.empty(0, dtype=torch.float32, device=q.device)
    torch.ops.ddtree_sm90.tree_attention(q, kv_cache, qo_indptr.contiguous(), verify_indptr, verify_indices, mask_words,
                                         sm_scale, out, lse, part_out, part_lse, num_splits)
    if num_splits > 1:
        from .triton_attention import combine_splits

        combine_splits(part_out, part_lse, qo_indptr, out, lse)
