"""Paged KV: `mla_tree_verify_paged`.

A paged cache `[num_pages, page_size, (1,) 576]` is a token pool of num_pages * page_size rows:
position `pos` of request b lives in slot `block_table[b, pos // page_size] * page_size +
pos % page_size`. `ddtree::paged_slot_lists` writes, per request, the slots of its
`cache_seqlens[b]` positions in `mla_tree_verify`'s layout (prefix slots, then the slots of its
n_b drafts, which are its last n_b positions); the ordinary preparation op then validates them and
builds the combined indices and the compact mask, and the attention op runs unchanged over the
pool view of the cache. So both entry points follow one set of rules for bad values.

Bad values never make a kernel read outside a tensor: a page id outside [0, num_pages) gives slot
-1 (an invisible key), and a request whose length does not fit (cache_seqlens[b] < n_b, or more
positions than its block-table row holds) keeps n_b keys, all -1, so its rows see nothing.

Every output shape is a function of input shapes only: verify_indices has
`B * max_pages * page_size + T_pad` entries (every request's table row full, plus one key per
draft row for requests whose length does not fit); entries past verify_indptr[B] are unspecified.
"""

from __future__ import annotations

import torch

from . import ops
from .api import PreparedVerify, _eager_checks_enabled, attend, mask_words_per_row, new_plan
from .checks import (INDEX_DTYPES, INDEX_LIMIT, _fail, check_index_arguments, check_kv_scale, check_query_and_cache,
                     check_index_values, check_status_argument, check_verify_shapes)
from .contract import QK_DIM


def paged_verify_len(batch, max_pages, page_size, num_rows):
    """Length of verify_indices for a paged batch: a bound from shapes only (see the module doc)."""
    return batch * max_pages * page_size + num_rows


def prepare_paged(block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, layout, page_size, num_pages, num_rows,
                  words_per_row, max_draft_len=0, status=None, plan=None, heads=0, publish_status=True):
    """The paged batch's preparation: its slot lists, then `ddtree::prepare_verify` over them.
    Returns prepare_verify's (verify_indptr, verify_indices [paged_verify_len], mask_words,
    sanitized qo_indptr); `plan`, when given, receives the schedule plan for `heads` heads.
    The slot lists record nothing (their faults are those prepare_verify finds in them), so the
    status follows prepare_verify's `publish_status`."""
    kv_indptr, kv_indices, out_cache_loc = ops.paged_slot_lists(block_table, cache_seqlens, qo_indptr, page_size, num_pages,
                                                                num_rows)
    return ops.prepare_verify(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows,
                              words_per_row, num_pages * page_size, max_draft_len, status, plan, heads, publish_status)


def _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr):
    """The paged arguments' shapes, dtypes and strides (no values read); returns the pool view
    [num_pages * page_size, 576] of kv_cache (never a copy)."""
    if not isinstance(q, torch.Tensor):
        _fail("q", "a torch.Tensor", type(q).__name__)
    dev = q.device
    rows = paged_pool_rows(kv_cache)
    num_pages, page_size = kv_cache.shape[0], kv_cache.shape[1]
    for name, t in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a torch.Tensor", type(t).__name__)
        if t.dtype not in INDEX_DTYPES:
            _fail(name, "of dtype torch.int32 or torch.int64", str(t.dtype))
        if t.device != dev:
            _fail(name, f"on {dev} (the device of q)", str(t.device))
    batch = qo_indptr.numel() - 1 if isinstance(qo_indptr, torch.Tensor) else 0
    if block_table.dim() != 2 or block_table.shape[0] < batch:
        _fail("block_table", f"[>= B, max_pages] with B = {batch} (from qo_indptr)", f"shape {tuple(block_table.shape)}")
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] < batch:
        _fail("cache_seqlens", f"of length >= B = {batch} (from qo_indptr)", f"shape {tuple(cache_seqlens.shape)}")
    if num_pages * page_size > INDEX_LIMIT or paged_verify_len(batch, block_table.shape[1], page_size, q.shape[0]) > INDEX_LIMIT:
        _fail("block_table", f"small enough for 32-bit positions (B x max_pages x page_size < 2^31)", f"shape {tuple(block_table.shape)}")
    return rows


def paged_pool_rows(kv_cache):
    """The pool view [num_pages * page_size, 576] of a paged cache (never a copy), after checking
    its shape and strides."""
    if not isinstance(kv_cache, torch.Tensor):
        _fail("kv_cache", "a torch.Tensor", type(kv_cache).__name__)
    if kv_cache.dim() not in (3, 4) or kv_cache.shape[-1] != QK_DIM or (kv_cache.dim() == 4 and kv_cache.shape[2] != 1):
        _fail("kv_cache", f"[num_pages, page_size, 1, {QK_DIM}] or [num_pages, page_size, {QK_DIM}]", f"shape {tuple(kv_cache.shape)}")
    pages = kv_cache.select(2, 0) if kv_cache.dim() == 4 else kv_cache
    num_pages, page_size = pages.shape[0], pages.shape[1]
    if page_size % 16 != 0 or page_size == 0:
        _fail("kv_cache", "pages of a multiple of 16 rows (page_size 64 is the fast path)", f"page_size {page_size}")
    # One pool of num_pages * page_size rows: pages one after the other, rows at one stride.
    if pages.stride(-1) != 1 or (num_pages > 1 and pages.stride(0) != page_size * pages.stride(1)):
        _fail("kv_cache", "pages stored one after the other (page stride = page_size x row stride), rows contiguous",
              f"strides {tuple(kv_cache.stride())}")
    return pages.flatten(0, 1)  # a view: the strides were checked above


def check_paged_inputs(q, kv_cache, *, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr=None, sm_scale,
                       mask_layout="full", out=None, lse=None, kv_scale=None, max_draft_len=None) -> None:
    """Every check of `mla_tree_verify_paged`, including those that read index values (a host
    sync; eager debugging and tests): lengths that fit their table rows and drafts, page ids in
    range, then `check_index_values` on the slot lists of the batch (qo_indptr, the mask)."""
    rows = _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr)
    check_verify_shapes(q, rows, qo_indptr, qo_indptr, qo_indptr, qo_indptr, tree_mask, mask_indptr, sm_scale, mask_layout,
                        out, lse, max_draft_len)
    check_kv_scale(kv_cache, kv_scale, q.device)
    _check_paged_values(q, kv_cache, rows, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout,
                        max_draft_len)


def _check_paged_values(q, kv_cache, rows, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout,
                        max_draft_len) -> None:
    """The checks of `check_paged_inputs` that read index values, after its shape checks."""
    batch = qo_indptr.numel() - 1
    page_size, num_pages = kv_cache.shape[1], kv_cache.shape[0]
    table = block_table[:batch].long().cpu()
    qo = qo_indptr.long().cpu()
    num_draft = qo[1:] - qo[:-1]
    seqlen = cache_seqlens[:batch].long().cpu()
    capacity = table.shape[1] * page_size
    for b in range(batch):  # requests with a negative draft count: check_index_values names qo_indptr
        length, n = int(seqlen[b]), int(num_draft[b])
        if n >= 0 and length < n:
            raise ValueError(f"ddtree_op: argument 'cache_seqlens' must count each request's drafts too (prefix + drafts), "
                             f"got cache_seqlens[{b}] = {length} below its {n} draft rows")
        if length > capacity:
            raise ValueError(f"ddtree_op: argument 'block_table' has {table.shape[1]} columns of {page_size}-row pages, "
                             f"but cache_seqlens[{b}] = {length} needs {-(-length // page_size)}")
    used = torch.arange(table.shape[1])[None, :] * page_size < seqlen[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bool(bad.any()):
        b, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"ddtree_op: argument 'block_table' holds page ids outside [0, {num_pages}) (the pages of "
                         f"kv_cache): block_table[{b}, {j}] = {int(table[b, j])}")
    kv_indptr, kv_indices, out_cache_loc = ops.paged_slot_lists(block_table, cache_seqlens, qo_indptr, page_size, num_pages,
                                                                q.shape[0])
    check_index_values(q, rows, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                       max_draft_len)


def mla_tree_verify_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    qo_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None = None,
    sm_scale: float,
    mask_layout: str = "full",
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    kv_scale: float | torch.Tensor | None = None,
    max_draft_len: int | None = None,
    backend: str = "auto",
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`mla_tree_verify` over a paged KV cache (FlashMLA's layout, SGLang's FlashMLA backend).

    kv_cache [num_pages, page_size, 1, 576] or [num_pages, page_size, 576]: bf16/fp16 (the dtype
    of q), or FP8 (float8_e4m3fn, or its uint8 bytes) with `kv_scale` (value = stored x kv_scale;
    a python float or a float32 tensor of one element, read on the device). page_size: a multiple
    of 16 (64 is the fast path). block_table [>= B, max_pages] int32/int64 page ids;
    cache_seqlens [>= B] int32/int64 = prefix + drafts: request b's drafts are its last
    n_b = qo_indptr[b+1] - qo_indptr[b] positions, their KV already written into its pages.

    tree_mask as in `mla_tree_verify` ("full": request b's block is [n_b, cache_seqlens[b]],
    prefix columns ignored; "qlen"; "packed"). Everything else as `mla_tree_verify`: out/lse
    buffers, padding rows (out 0, lse -inf), backend, max_draft_len, compile and graph replay
    with new tables, lengths, trees and kv_scale tensor values.

    Bad values are sanitized, never read through: a page id outside [0, num_pages) is an invisible
    key; a request with cache_seqlens[b] < n_b, or more positions than its table row holds, sees
    nothing (out 0, lse -inf). `status` records faults as for `mla_tree_verify`; here the slot
    kinds ('kv_slot', 'draft_slot') mean a page id out of range or a length that does not fit,
    and their positions index the internal slot lists, not block_table. With DDTREE_CHECK=1,
    eager calls first run `check_paged_inputs` (errors naming block_table and cache_seqlens).
    """
    rows = _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr)
    # Every other argument is checked as `mla_tree_verify` checks it, with qo_indptr standing in
    # for the slot lists this entry point does not take (they are built below, well formed).
    check_verify_shapes(q, rows, qo_indptr, qo_indptr, qo_indptr, qo_indptr, tree_mask, mask_indptr, sm_scale, mask_layout,
                        out, lse, max_draft_len, status)
    check_kv_scale(kv_cache, kv_scale, q.device)
    if _eager_checks_enabled():
        check_paged_inputs(q, kv_cache, block_table=block_table, cache_seqlens=cache_seqlens, qo_indptr=qo_indptr,
                           tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=sm_scale, mask_layout=mask_layout, out=out,
                           lse=lse, kv_scale=kv_scale, max_draft_len=max_draft_len)
    prepared = _prepare_paged(q, kv_cache, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout,
                              max_draft_len, status, publish_status=False)
    return attend(q, rows, *prepared.attention_inputs(), sm_scale, out, lse, backend, kv_scale, prepared.plan, status)


def _prepare_paged(q, kv_cache, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout, max_draft_len,
                   status, publish_status):
    """The paged preparation (after the shape checks) for q's rows and heads."""
    num_rows, heads, page_size, num_pages = q.shape[0], q.shape[1], kv_cache.shape[1], kv_cache.shape[0]
    words = mask_words_per_row(tree_mask, mask_layout, num_rows, max_draft_len)
    plan = new_plan(q, qo_indptr)
    verify_indptr, verify_indices, mask_words, qo_sanitized = prepare_paged(
        block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout, page_size, num_pages, num_rows, words,
        max_draft_len or 0, status, plan, heads, publish_status=publish_status)
    return PreparedVerify(qo_sanitized, verify_indptr, verify_indices, mask_words, plan, num_rows, heads,
                          num_pages * page_size, page_size)


def prepare_tree_verify_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    qo_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None = None,
    mask_layout: str = "full",
    max_draft_len: int | None = None,
    status: torch.Tensor | None = None,
) -> PreparedVerify:
    """`prepare_tree_verify` for a paged cache: the first half of `mla_tree_verify_paged`, once
    per verify step, then `mla_tree_verify_prepared` with each layer's q and paged cache. q and
    kv_cache may be any layer's (their shapes, dtypes and device are read); arguments as in
    `mla_tree_verify_paged`. This call publishes `status`."""
    rows = _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr)
    check_query_and_cache(q, rows)
    check_index_arguments(q, qo_indptr, qo_indptr, qo_indptr, qo_indptr, tree_mask, mask_indptr, mask_layout, max_draft_len)
    if status is not None:
        check_status_argument(status, q.device)
    if _eager_checks_enabled():
        _check_paged_values(q, kv_cache, rows, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout,
                            max_draft_len)
    return _prepare_paged(q, kv_cache, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout,
                          max_draft_len, status, publish_status=True)
