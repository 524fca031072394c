"""The public verify step over a token-slot pool: `mla_tree_verify` (preparation and attention in
one call), and its two halves for a model whose layers share one batch: `prepare_tree_verify`
once per step, `mla_tree_verify_prepared` once per layer."""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import ops
from .environment import CHECK_ENV, flag
from .checks import (_fail, check_attention_arguments, check_index_arguments, check_index_values, check_kv_scale,
                     check_query_and_cache, check_status_argument, check_verify_inputs, check_verify_shapes, kv_rows)
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
    # The attention launch publishes the status the preparation recorded (status.py).
    prepared = _prepare(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                        max_draft_len, status, publish_status=False)
    return attend(q, kv_rows(kv_cache), *prepared.attention_inputs(), sm_scale, out, lse, backend, kv_scale, prepared.plan,
                  status)


class PreparedVerify(NamedTuple):
    """One verify step's preparation (`prepare_tree_verify`, `prepare_tree_verify_paged`): the
    combined indices, the compact mask and the schedule plan of the sanitized batch, valid for
    every layer's attention over that batch (`mla_tree_verify_prepared`) until its index tensors
    change. Those calls run one after another (one stream, as a model's layers do): while the
    sm90 kernel runs it counts merged pieces in the plan, and sets the counts back to 0 before it
    ends. `num_tokens`, `heads` and `num_slots` are the shapes it was made for; `page_size` is 0
    for a token-slot pool, else the page size of the paged cache."""

    qo_indptr: torch.Tensor  # sanitized, int32 [B+1]
    verify_indptr: torch.Tensor
    verify_indices: torch.Tensor
    mask_words: torch.Tensor
    plan: torch.Tensor
    num_tokens: int
    heads: int
    num_slots: int
    page_size: int = 0

    def attention_inputs(self):
        """(qo_indptr, verify_indptr, verify_indices, mask_words), as the attention op takes them."""
        return self.qo_indptr, self.verify_indptr, self.verify_indices, self.mask_words


def _prepare(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, max_draft_len,
             status, publish_status):
    """The preparation launch (after the shape checks) for q's rows and heads and kv_cache's slots."""
    num_rows, heads, num_slots = q.shape[0], q.shape[1], kv_rows(kv_cache).shape[0]
    words = mask_words_per_row(tree_mask, mask_layout, num_rows, max_draft_len)
    # The attention op reads the sanitized qo_indptr the preparation returns, never the raw one,
    # and the schedule plan made in the same launch.
    plan = new_plan(q, qo_indptr)
    verify_indptr, verify_indices, mask_words, qo_sanitized = ops.prepare_verify(
        qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, num_rows, words, num_slots,
        max_draft_len or 0, status, plan, heads, publish_status=publish_status,
    )
    return PreparedVerify(qo_sanitized, verify_indptr, verify_indices, mask_words, plan, num_rows, heads, num_slots)


def prepare_tree_verify(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None = None,
    mask_layout: str = "full",
    max_draft_len: int | None = None,
    status: torch.Tensor | None = None,
) -> PreparedVerify:
    """The first half of `mla_tree_verify`, once per verify step: validates and sanitizes the
    batch's indices and tree mask and makes the schedule plan (one launch on CUDA, device-only).

    Every layer of a model attends over the same batch (same slots, same trees): prepare once,
    then call `mla_tree_verify_prepared` with each layer's q and KV pool. q and kv_cache may be
    any layer's: only their shapes, dtypes and device are read. Arguments as in
    `mla_tree_verify`. This call publishes `status` (the attention calls take none), so
    `raise_on_status(status)` may read it after any of them.
    """
    check_query_and_cache(q, kv_cache)
    check_index_arguments(q, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, max_draft_len)
    if status is not None:
        check_status_argument(status, q.device)
    if _eager_checks_enabled():
        check_index_values(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                           max_draft_len)
    return _prepare(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                    max_draft_len, status, publish_status=True)


def mla_tree_verify_prepared(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    prepared: PreparedVerify,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    kv_scale: float | torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The second half of `mla_tree_verify`: one layer's attention over a prepared step.

    q [T_pad, H, 576] and kv_cache of the shapes `prepared` was made for (a token-slot pool
    [S, (1,) 576]; after `prepare_tree_verify_paged`, the paged cache [num_pages, page_size,
    (1,) 576]); sm_scale, out, lse, kv_scale and backend as in `mla_tree_verify`, whose result
    this is, bit for bit. Returns (out, lse).
    """
    if not isinstance(prepared, PreparedVerify):
        _fail("prepared", "a PreparedVerify (ddtree_op.prepare_tree_verify)", type(prepared).__name__)
    if prepared.page_size:
        from .paged import paged_pool_rows

        rows = paged_pool_rows(kv_cache)
        if kv_cache.shape[1] != prepared.page_size:
            _fail("kv_cache", f"pages of {prepared.page_size} rows (the cache the step was prepared for)",
                  f"shape {tuple(kv_cache.shape)}")
    else:
        rows = kv_cache
    check_query_and_cache(q, rows)
    rows = kv_rows(rows)
    if tuple(q.shape[:2]) != (prepared.num_tokens, prepared.heads):
        _fail("q", f"[{prepared.num_tokens}, {prepared.heads}, 576] (the rows and heads the step was prepared for)",
              f"shape {tuple(q.shape)}")
    if rows.shape[0] != prepared.num_slots:
        _fail("kv_cache", f"a pool of {prepared.num_slots} slots (the pool the step was prepared for)", f"{rows.shape[0]} slots")
    if prepared.verify_indices.device != q.device:
        _fail("prepared", f"made on {q.device} (the device of q)", str(prepared.verify_indices.device))
    check_attention_arguments(q, sm_scale, out, lse)
    check_kv_scale(kv_cache, kv_scale, q.device)
    return attend(q, rows, *prepared.attention_inputs(), sm_scale, out, lse, backend, kv_scale, prepared.plan)

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
