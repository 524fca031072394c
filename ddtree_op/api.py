"""`mla_tree_verify`: the public verify step (combined indices, compact mask, attention)."""

from __future__ import annotations

import torch

from . import ops
from .environment import CHECK_ENV, flag
from .checks import check_kv_scale, check_verify_inputs, check_verify_shapes, kv_rows
from .contract import LATENT_DIM, PACKED_MASK_BITS, plan_numel


def _eager_checks_enabled() -> bool:
    if torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return False
    return flag(CHECK_ENV)


def mask_words_per_row(tree_mask: torch.Tensor, mask_layout: str, num_rows: int, max_draft_len: int | None) -> int:
    """64-bit words per draft row of the compact mask; a function of shapes and static ints only."""
    if mask_layout == "packed":
        bound = PACKED_MASK_BITS[tree_mask.dtype]
    else:
        bound = max_draft_len if max_draft_len is not None else num_rows
    if max_draft_len is not None:
        bound = min(bound, max_draft_len)
    return max(1, (bound + 63) // 64)


def mla_tree_verify(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None = None,
    sm_scale: float,
    mask_layout: str = "full",
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    max_draft_len: int | None = None,
    backend: str = "auto",
    status: torch.Tensor | None = None,
    kv_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-masked MLA attention of the verify step of tree speculative decoding.

    q [T_pad, H, 576] bf16/fp16; kv_cache [S, 576] or [S, 1, 576] (same dtype, row stride >= 576),
    or an FP8 cache: float8_e4m3fn or the uint8 bytes of it, value = stored x `kv_scale` (a python
    float or a float32 tensor of one element read on the device; default 1).
    Request b's keys are its prefix `kv_indices[kv_indptr[b]:kv_indptr[b+1]]` followed by its
    drafts `out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]`; V is the first 512 columns of each key row.
    tree_mask follows `mask_layout` ("full", "qlen" or "packed"; see README). `max_draft_len`
    (optional, static) bounds the drafts of one request and sizes the compact mask; without it
    the bound is T_pad (or the packed dtype's width). `backend` is "auto", "triton", "sm90"
    or "reference" ("auto" picks the fastest kernel for the device; CPU always runs the reference;
    "cutlass" is a deprecated name of "sm90").

    Returns (out [T_pad, H, 512] dtype of q, lse [T_pad, H] float32), written into `out`/`lse`
    when given. Rows past qo_indptr[B] get out 0 and lse -inf.

    Bad index values never make a kernel read or write outside its tensors: the preparation
    sanitizes them (a slot outside [0, S) is an invisible key; a request whose ranges are
    inconsistent gets out 0, lse -inf). `status` (optional, `ddtree_op.new_status()`) records
    what was sanitized, on the device and without a sync, also under CUDA-graph replay and
    torch.compile; `ddtree_op.raise_on_status(status)` turns it into check_verify_inputs' error.

    The backend is chosen once per (device, backend, dtype, row alignment) and cached; the
    environment (DDTREE_CHECK, DDTREE_DISABLE_SM90) is read once per process, on first use.
    """
    check_verify_shapes(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, sm_scale, mask_layout, out, lse, max_draft_len,
                        status)
    if _eager_checks_enabled():
        check_verify_inputs(
            q, kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, out_cache_loc=out_cache_loc,
            tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=sm_scale, mask_layout=mask_layout,
            out=out, lse=lse, max_draft_len=max_draft_len,
        )
    check_kv_scale(kv_cache, kv_scale, q.device)
    rows = kv_rows(kv_cache)
    num_rows = q.shape[0]
    words = mask_words_per_row(tree_mask, mask_layout, num_rows, max_draft_len)
    # The attention op reads the sanitized qo_indptr the preparation returns, never the raw one,
    # and the schedule plan it makes in the same launch; it publishes the status the preparation
    # recorded (status.py).
    plan = new_plan(q, qo_indptr)
    verify_indptr, verify_indices, mask_words, qo_indptr = ops.prepare_verify(
        qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, num_rows, words,
        rows.shape[0], max_draft_len or 0, status, plan, q.shape[1], publish_status=False,
    )
    return attend(q, rows, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend, kv_scale, plan,
                  status)


def new_plan(q, qo_indptr):
    """The buffer of the schedule plan that prepare_verify writes (its size from shapes only)."""
    return q.new_empty(plan_numel(q.shape[0], q.shape[1], qo_indptr.shape[0] - 1), dtype=torch.int64)


def attend(q, rows, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend, kv_scale=None, plan=None,
           status=None):
    """The attention op over prepared inputs (both entry points): `rows` is the [S, 576] pool, a
    uint8 one read as the float8_e4m3fn bytes it holds; `plan` the preparation's schedule plan;
    `status` the one the preparation left unpublished (publish_status=False), published here."""
    sm_scale = float(sm_scale)
    if rows.dtype == torch.uint8:
        rows = rows.view(torch.float8_e4m3fn)
    scale_tensor = kv_scale if isinstance(kv_scale, torch.Tensor) else None
    scale_value = 1.0 if kv_scale is None or scale_tensor is not None else float(kv_scale)
    if out is None and lse is None:
        return ops.tree_attention(q, rows, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, backend,
                                  scale_tensor, scale_value, plan, status)
    if out is None:
        out = q.new_empty((q.shape[0], q.shape[1], LATENT_DIM))
    if lse is None:
        lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    ops.tree_attention_into(q, rows, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend,
                            scale_tensor, scale_value, plan, status)
    return out, lse
