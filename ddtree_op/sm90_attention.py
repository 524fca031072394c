"""The sm_90a CuTe/wgmma kernel (cutlass_kernels/sm90/) behind the attention op's "cutlass" backend.

Same contract as the Triton fallback: packed (draft, head) rows, combined indices, compact mask,
shape-only schedule, LSE combine of partials in Triton. Two kernels, chosen from shapes: "split"
(a CTA per row block and key split, as the Triton kernel) and "persistent" (one CTA per SM
walking a plan that the device makes from the lengths: the same pieces, or equal shares of all
the work when requests are unequal; balanced_schedule.py).
"""

from __future__ import annotations

import torch

from . import build
from .balanced_schedule import ROWS_PER_BLOCK, use_persistent
from .schedule import num_kv_splits_whole_tiles, sm_count

ROWS_PER_CTA = 64
CTAS_PER_SM = 1  # 216 KB of shared memory per CTA
# The kernel's splits hold whole pairs of 64-key tiles. Short splits pay off: one CTA's fixed cost
# (index loads, first copies, epilogue) is a few microseconds, and partials of 64 rows are small.
KEYS_PER_SPLIT = 128
MAX_SPLITS = 128


def tree_attention_sm90(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, num_splits=None,
                        schedule=None, ctas=None):
    """schedule: None (chosen from shapes), "split" or "persistent" (over `ctas` CTAs, by default one
    per SM). num_splits: key splits per row block (default: from shapes)."""
    build.load_library("sm90")
    num_tokens, heads = q.shape[0], q.shape[1]
    if num_tokens == 0:
        return
    batch = qo_indptr.numel() - 1
    ctas = ctas or sm_count(q.device) * CTAS_PER_SM
    if num_splits is None:
        num_splits = num_kv_splits_whole_tiles(num_tokens, heads, batch, verify_indices.numel(), ctas, ROWS_PER_CTA,
                                               CTAS_PER_SM, KEYS_PER_SPLIT, MAX_SPLITS)
    if schedule is None:
        persistent = use_persistent(num_tokens, heads, batch, verify_indices.numel(), ctas, num_splits)
        schedule = "persistent" if persistent else "split"
    qo_indptr = qo_indptr.contiguous()
    if schedule == "persistent":
        from .balanced_combine import combine_persistent

        # Two partial slots per CTA (its first and last segment): 2 * 132 * 128 KB on an H200.
        part_out = torch.empty((2 * ctas, ROWS_PER_BLOCK, 512), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((2 * ctas, ROWS_PER_BLOCK), dtype=torch.float32, device=q.device)
        torch.ops.ddtree_sm90.tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale,
                                             out, lse, part_out, part_lse, num_splits, ctas)
        combine_persistent(part_out, part_lse, qo_indptr, verify_indptr, out, lse, ctas, num_splits)
        return
    if schedule != "split":
        raise ValueError(f"ddtree_op: argument 'schedule' must be None, 'split' or 'persistent', not {schedule!r}")
    if num_splits > 1:
        part_out = torch.empty((num_splits, num_tokens * heads, 512), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, num_tokens * heads), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = torch.empty(0, dtype=torch.float32, device=q.device)
    torch.ops.ddtree_sm90.tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out,
                                         lse, part_out, part_lse, num_splits, 0)
    if num_splits > 1:
        from .triton_attention import combine_splits

        combine_splits(part_out, part_lse, qo_indptr, out, lse)
