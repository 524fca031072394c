"""Paged KV: `mla_tree_verify_paged` and the op that rewrites a block table as slot lists.

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

from . import build, ops
from .api import attend, mask_words_per_row
from .checks import INDEX_DTYPES, INDEX_LIMIT, _fail, check_kv_scale, check_verify_shapes
from .contract import QK_DIM

_lib = torch.library.Library("ddtree", "FRAGMENT")  # module-level: the op lives as long as this

_lib.define(
    "paged_slot_lists(Tensor block_table, Tensor cache_seqlens, Tensor qo_indptr, SymInt page_size, SymInt num_pages,"
    " SymInt num_rows) -> (Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc)"
)


def paged_verify_len(batch, max_pages, page_size, num_rows):
    """Length of verify_indices for a paged batch: a bound from shapes only (see the module doc)."""
    return batch * max_pages * page_size + num_rows


def paged_lengths(block_table, cache_seqlens, qo_indptr, page_size, num_rows):
    """Per request, from the raw arguments: (qo, keys, fits) with qo the draft-row indptr made
    monotone inside [0, num_rows] (int64 [B+1]), keys the key count (int64 [B]) and fits whether
    the request's positions fit its table row and its drafts (bool [B])."""
    batch = qo_indptr.numel() - 1
    capacity = block_table.shape[1] * page_size
    qo = torch.cummax(qo_indptr.long().clamp(0, num_rows), 0).values
    num_draft = qo[1:] - qo[:-1]
    seqlen = cache_seqlens[:batch].long()
    fits = (seqlen >= num_draft) & (seqlen <= capacity)
    keys = torch.where(fits, seqlen, num_draft)
    return qo, keys, fits


def paged_slot_lists(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    """The CPU implementation of `ddtree::paged_slot_lists` (a tensor program, no host reads): the
    paged batch in `mla_tree_verify`'s layout, (kv_indptr int32 [B+1], kv_indices int32
    [B * max_pages * page_size], out_cache_loc int32 [num_rows]), with the slots of every
    request's prefix positions and of its draft positions; slot -1 where the page id is out of
    range or the request does not fit (its prefix is then empty). kv_indices past kv_indptr[B]
    is unspecified (the CUDA kernel leaves it unwritten)."""
    device = qo_indptr.device
    batch = qo_indptr.numel() - 1
    max_pages = block_table.shape[1]
    qo, keys, fits = paged_lengths(block_table, cache_seqlens, qo_indptr, page_size, num_rows)
    num_draft = qo[1:] - qo[:-1]
    prefix = torch.where(fits, keys - num_draft, torch.zeros_like(keys))
    kv_indptr = torch.zeros(batch + 1, dtype=torch.long, device=device)
    torch.cumsum(prefix, 0, out=kv_indptr[1:])

    def slots_at(req, pos):
        column = (pos // page_size).clamp(0, max(max_pages - 1, 0))
        page = block_table[req, column].long() if max_pages > 0 else torch.full_like(pos, -1)
        used = fits[req] & (page >= 0) & (page < num_pages)
        return torch.where(used, page * page_size + pos % page_size, torch.full_like(pos, -1))

    kv_indices = torch.full((batch * max_pages * page_size,), -1, dtype=torch.long, device=device)
    out_cache_loc = torch.full((num_rows,), -1, dtype=torch.long, device=device)
    if batch > 0:
        entry = torch.arange(kv_indices.numel(), device=device)
        req = torch.searchsorted(kv_indptr[1:], entry, right=True).clamp_(max=batch - 1)
        kv_indices = torch.where(entry < kv_indptr[batch], slots_at(req, entry - kv_indptr[req]), kv_indices)
        row = torch.arange(num_rows, device=device)
        req = torch.searchsorted(qo[1:], row, right=True).clamp_(max=batch - 1)
        in_batch = (row >= qo[0]) & (row < qo[batch])
        out_cache_loc = torch.where(in_batch, slots_at(req, prefix[req] + row - qo[req]), out_cache_loc)
    return kv_indptr.int(), kv_indices.int(), out_cache_loc.int()


def _paged_slot_lists_cuda(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    # A one-block scan of the lengths, then a thread per slot (cutlass_kernels/paged_indices.cu).
    build.load_cuda_library()
    table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    return torch.ops.ddtree_cuda.paged_slot_lists(table, cache_seqlens.contiguous(), qo_indptr.contiguous(), page_size,
                                                  num_pages, num_rows)


def paged_slot_lists_fake(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    batch = qo_indptr.shape[0] - 1
    kv_indptr = qo_indptr.new_empty(batch + 1, dtype=torch.int32)
    kv_indices = qo_indptr.new_empty(batch * block_table.shape[1] * page_size, dtype=torch.int32)
    out_cache_loc = qo_indptr.new_empty(num_rows, dtype=torch.int32)
    return kv_indptr, kv_indices, out_cache_loc


_lib.impl("paged_slot_lists", paged_slot_lists, "CPU")
_lib.impl("paged_slot_lists", _paged_slot_lists_cuda, "CUDA")
torch.library.register_fake("ddtree::paged_slot_lists", paged_slot_lists_fake, lib=_lib)

paged_slot_lists_op = torch.ops.ddtree.paged_slot_lists.default


def prepare_paged(block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, layout, page_size, num_pages, num_rows,
                  words_per_row, max_draft_len=0, status=None):
    """The paged batch's preparation: its slot lists, then `ddtree::prepare_verify` over them.
    Returns prepare_verify's (verify_indptr, verify_indices [paged_verify_len], mask_words,
    sanitized qo_indptr)."""
    kv_indptr, kv_indices, out_cache_loc = paged_slot_lists_op(block_table, cache_seqlens, qo_indptr, page_size, num_pages,
                                                               num_rows)
    return ops.prepare_verify(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows,
                              words_per_row, num_pages * page_size, max_draft_len, status)


def _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr):
    """The paged arguments' shapes, dtypes and strides (no values read); returns the pool view
    [num_pages * page_size, 576] of kv_cache (never a copy)."""
    if not isinstance(q, torch.Tensor):
        _fail("q", "a torch.Tensor", type(q).__name__)
    dev = q.device
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
    return pages.flatten(0, 1)  # a view: the strides were checked above


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
    and their positions index the internal slot lists, not block_table.
    """
    rows = _check_paged_shapes(q, kv_cache, block_table, cache_seqlens, qo_indptr)
    # Every other argument is checked as `mla_tree_verify` checks it, with qo_indptr standing in
    # for the slot lists this entry point does not take (they are built below, well formed).
    check_verify_shapes(q, rows, qo_indptr, qo_indptr, qo_indptr, qo_indptr, tree_mask, mask_indptr, sm_scale, mask_layout,
                        out, lse, max_draft_len, status)
    check_kv_scale(kv_cache, kv_scale, q.device)
    num_rows = q.shape[0]
    words = mask_words_per_row(tree_mask, mask_layout, num_rows, max_draft_len)
    verify_indptr, verify_indices, mask_words, qo_sanitized = prepare_paged(
        block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr, mask_layout, kv_cache.shape[1], kv_cache.shape[0],
        num_rows, words, max_draft_len or 0, status)
    return attend(q, rows, qo_sanitized, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend, kv_scale)
