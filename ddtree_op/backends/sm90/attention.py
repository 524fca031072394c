"""The sm_90a CuTe/wgmma kernel (cutlass_kernels/sm90/) behind the attention op's "sm90" backend.

Same contract as the Triton fallback: packed (draft, head) rows, combined indices, compact mask,
shape-only grids, LSE combine of partials in Triton. Two kernels, chosen from shapes: "split"
(a CTA per piece: a row block and a range of its keys, long requests in more pieces;
schedule.py) and "persistent" (one CTA per SM walking its segments: pieces of equal splits, or
equal shares of all the work when requests are unequal; persistent_schedule.py; it merges its
partials itself). Both read the schedule plan that the preparation made on the device for the
CTAs and splits of plan_shape (cutlass_kernels/verify_plan.cuh); a call without one, or for
another schedule, makes its own in one launch.
"""

from __future__ import annotations

import os

import torch

from ... import build
from ...contract import LATENT_DIM, PARTIAL_SLOTS_PER_CTA, PIECE_SLOTS_PER_SPLIT, ROWS_PER_BLOCK
from ..splits import sm_count
from .persistent_schedule import use_persistent
from .schedule import fp8_kernel_for_shapes, plan_shape, sm90_splits

FP8_KERNELS = ("auto", "transposed", "widened")


def make_plan(qo_indptr, verify_indptr, num_tokens: int, heads: int, ctas: int, splits: int) -> torch.Tensor:
    """The schedule plan of a batch that the preparation did not plan for this schedule."""
    build.load_cuda_library()
    return torch.ops.ddtree_cuda.verify_plan(qo_indptr, verify_indptr, num_tokens, heads, ctas, splits)


def fp8_kernel_choice(fp8_kernel: str | None) -> str:
    """The e4m3 kernel: the argument, else DDTREE_SM90_FP8_KERNEL (for A/B timing), else "auto"."""
    choice = fp8_kernel or os.environ.get("DDTREE_SM90_FP8_KERNEL", "auto")
    if choice not in FP8_KERNELS:
        raise ValueError(f"ddtree_op: fp8_kernel (or DDTREE_SM90_FP8_KERNEL) must be one of {FP8_KERNELS}, not {choice!r}")
    return choice


def tree_attention_sm90(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, num_splits=None,
                        schedule=None, ctas=None, plan=None, status=None, kv_scale=None, kv_scale_value=1.0, fp8_kernel=None):
    """schedule: None (chosen from shapes), "split" or "persistent" (over `ctas` CTAs, by default one
    per SM). num_splits: key splits per row block (default: from shapes). plan: the preparation's
    schedule plan (prepare_verify's, made for plan_shape), or None. status: published by the
    kernel's first CTA (what prepare_verify with publish_status=False left in it), where q has
    rows; with none the kernel is not launched and the caller publishes. kv_scale (float32 [1] on
    the device) or else kv_scale_value: an e4m3 (float8_e4m3fn) cache's scale, dequantized in the
    kernel. fp8_kernel, for an e4m3 cache: "transposed" (the split schedule's transposed kernel,
    which keeps the tiles e4m3 in shared memory), "widened" (the tiles widened in shared memory,
    either schedule) or "auto" (where the schedule is not given, the one schedule.py's
    fp8_kernel_for_shapes names, the transposed one in the split schedule; where it is split, the
    transposed one); None: fp8_kernel_choice's where the schedule is not given."""
    build.load_library("sm90")
    num_tokens, heads = q.shape[0], q.shape[1]
    if num_tokens == 0:
        return
    batch = qo_indptr.numel() - 1
    num_keys = verify_indices.numel()
    planned_ctas, planned_splits = plan_shape(sm_count(q.device), num_tokens, heads, batch, num_keys)
    ctas = ctas or planned_ctas
    if num_splits is None:
        num_splits = sm90_splits(num_tokens, heads, batch, num_keys, ctas)
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if fp8_kernel is None and (not fp8 or schedule is not None):
        fp8_kernel = "auto"  # the environment's choice is for calls that leave the schedule to shapes
    fp8_kernel = fp8_kernel_choice(fp8_kernel)
    if fp8 and schedule is None and fp8_kernel == "auto":
        fp8_kernel = fp8_kernel_for_shapes(num_tokens, heads, batch, num_keys, num_splits)
    if schedule is None and fp8 and fp8_kernel == "transposed":
        schedule = "split"
    if schedule is None:
        persistent = use_persistent(num_tokens, heads, batch, num_keys, ctas, num_splits)
        schedule = "persistent" if persistent else "split"
    if schedule not in ("split", "persistent"):
        raise ValueError(f"ddtree_op: argument 'schedule' must be None, 'split' or 'persistent', not {schedule!r}")
    qo_indptr = qo_indptr.contiguous()
    if plan is None or (ctas, num_splits) != (planned_ctas, planned_splits):
        plan = make_plan(qo_indptr, verify_indptr, num_tokens, heads, ctas, num_splits)
    if schedule == "persistent":
        # Two partial slots per CTA (its first and last segment): 2 * 132 * 128 KB on an H200. The
        # kernel merges them itself (the CTA that writes a row block's last one).
        slots = PARTIAL_SLOTS_PER_CTA * ctas
        part_out = torch.empty((slots, ROWS_PER_BLOCK, LATENT_DIM), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((slots, ROWS_PER_BLOCK), dtype=torch.float32, device=q.device)
        torch.ops.ddtree_sm90.tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale,
                                             out, lse, part_out, part_lse, num_splits, ctas, plan, status, kv_scale,
                                             kv_scale_value, fp8_kernel)
        return
    if num_splits > 1:  # partials [slot, row]: a row block has up to PIECE_SLOTS_PER_SPLIT * splits pieces
        slots = PIECE_SLOTS_PER_SPLIT * num_splits
        part_out = torch.empty((slots, num_tokens * heads, LATENT_DIM), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((slots, num_tokens * heads), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = torch.empty(0, dtype=torch.float32, device=q.device)
    torch.ops.ddtree_sm90.tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out,
                                         lse, part_out, part_lse, num_splits, 0, plan, status, kv_scale, kv_scale_value,
                                         fp8_kernel)
    if num_splits > 1:
        from ..lse_merge import combine_splits

        combine_splits(part_out, part_lse, qo_indptr, out, lse, eager_slots=num_splits)
