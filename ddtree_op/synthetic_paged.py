"""Synthetic paged verify steps (FlashMLA's layout), optionally with an FP8 e4m3 cache, for tests
and benchmarks.

Request b holds `cache_seqlens[b] = P_b + n_b` positions in pages of `page_size` rows, listed in
its row of `block_table`; its drafts are its last n_b positions. Pages are handed out in a
shuffled order, so neighbouring positions of a request sit in unrelated pages; the table's unused
columns hold page ids that must never be read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .contract import QK_DIM
from .synthetic import DEEPSEEK_V3_SM_SCALE, encode_tree_mask, random_tree_parents, tree_visibility

FP8_DTYPE = torch.float8_e4m3fn


@dataclass
class PagedBatch:
    """Inputs of one paged verify step plus the trees that made them (for independent references)."""

    q: torch.Tensor
    kv_cache: torch.Tensor  # [num_pages, page_size, 1, 576] (or without the 1)
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    qo_indptr: torch.Tensor
    tree_mask: torch.Tensor
    mask_indptr: torch.Tensor | None
    mask_layout: str
    sm_scale: float
    kv_scale: float | torch.Tensor | None
    page_size: int
    prefix_lens: list[int]
    draft_lens: list[int]
    visibility: list[torch.Tensor]

    def kwargs(self) -> dict:
        """Keyword arguments of `mla_tree_verify_paged` (after q and kv_cache)."""
        return dict(
            block_table=self.block_table,
            cache_seqlens=self.cache_seqlens,
            qo_indptr=self.qo_indptr,
            tree_mask=self.tree_mask,
            mask_indptr=self.mask_indptr,
            sm_scale=self.sm_scale,
            mask_layout=self.mask_layout,
            kv_scale=self.kv_scale,
        )

    def slot(self, b: int, pos: int) -> int:
        page = int(self.block_table[b, pos // self.page_size])
        return page * self.page_size + pos % self.page_size

    def slot_lists(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr, kv_indices, out_cache_loc) of the same step in `mla_tree_verify`'s layout."""
        prefix = [self.slot(b, j) for b, p in enumerate(self.prefix_lens) for j in range(p)]
        drafts = [self.slot(b, p + j) for b, (p, n) in enumerate(zip(self.prefix_lens, self.draft_lens)) for j in range(n)]
        dev = self.qo_indptr.device
        kv_indptr = torch.tensor([0] + self.prefix_lens, dtype=torch.long).cumsum(0)
        return (kv_indptr.to(dev, torch.int32), torch.tensor(prefix, dtype=torch.int32, device=dev),
                torch.tensor(drafts, dtype=torch.int64, device=dev))


def fp8_cache(values: torch.Tensor, kv_scale: float, storage: str = "fp8") -> torch.Tensor:
    """values / kv_scale in e4m3 (so that stored x kv_scale ~ values), as float8_e4m3fn or as the
    uint8 bytes of it (SGLang keeps its FP8 pool as uint8)."""
    stored = (values / kv_scale).clamp(-448, 448).to(FP8_DTYPE)
    return stored.view(torch.uint8) if storage == "uint8" else stored


def make_paged_batch(
    prefix_lens: list[int],
    draft_lens: list[int],
    heads: int,
    *,
    page_size: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: str = "same",  # "same" (dtype of q), "fp8" or "uint8" (e4m3 bytes)
    kv_scale: float | None = None,  # for fp8: default 0.05; a tensor is made with kv_scale_tensor
    kv_scale_tensor: bool = False,
    device: str | torch.device = "cpu",
    layout: str = "full",
    seed: int = 0,
    pad_rows: int = 0,
    chain: bool = False,
    extra_pages: int = 3,
    extra_columns: int = 2,
    table_rows: int | None = None,
    kv_cache_3d: bool = False,
) -> PagedBatch:
    """A random paged verify step: shuffled pages, random trees, random q and KV."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    seqlens = [p + n for p, n in zip(prefix_lens, draft_lens)]
    pages_per_request = [math.ceil(length / page_size) for length in seqlens]
    num_pages = sum(pages_per_request) + extra_pages
    order = torch.randperm(num_pages, generator=gen)
    max_pages = max(pages_per_request, default=0) + extra_columns
    rows = max(batch, table_rows or 0)
    # Unused columns (and rows past B) hold page ids in range: reading them would go unnoticed
    # by bounds, so only the results can tell.
    block_table = torch.randint(0, num_pages, (rows, max_pages), generator=gen, dtype=torch.int32)
    start = 0
    for b, count in enumerate(pages_per_request):
        block_table[b, :count] = order[start : start + count].int()
        start += count

    qo_indptr = torch.tensor([0] + draft_lens, dtype=torch.long).cumsum(0)
    visibility = [tree_visibility(random_tree_parents(n, gen, chain)) for n in draft_lens]
    tree_mask, mask_indptr = encode_tree_mask(visibility, prefix_lens, layout)  # full: row stride P + n

    q = torch.randn(sum(draft_lens) + pad_rows, heads, QK_DIM, generator=gen).to(dtype)
    values = torch.randn(num_pages, page_size, QK_DIM, generator=gen)
    scale_value = None
    if kv_dtype == "same":
        kv = values.to(dtype)
    else:
        scale_value = 0.05 if kv_scale is None else kv_scale
        kv = fp8_cache(values, scale_value, "uint8" if kv_dtype == "uint8" else "fp8")
    if not kv_cache_3d:
        kv = kv.view(num_pages, page_size, 1, QK_DIM)
    dev = torch.device(device)
    scale = scale_value
    if scale_value is not None and kv_scale_tensor:
        scale = torch.tensor([scale_value], dtype=torch.float32, device=dev)
    return PagedBatch(
        q=q.to(dev),
        kv_cache=kv.to(dev),
        block_table=block_table.to(dev),
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=dev),
        qo_indptr=qo_indptr.to(dev, torch.int32),
        tree_mask=tree_mask.to(dev),
        mask_indptr=None if mask_indptr is None else mask_indptr.to(dev, torch.int64),
        mask_layout=layout,
        sm_scale=DEEPSEEK_V3_SM_SCALE,
        kv_scale=scale,
        page_size=page_size,
        prefix_lens=list(prefix_lens),
        draft_lens=list(draft_lens),
        visibility=visibility,
    )


def dequantized_pool(kv_cache: torch.Tensor, kv_scale) -> torch.Tensor:
    """float64 [rows, 576] of a whole pool (tests only: the op never dequantizes the whole cache)."""
    rows = kv_cache.reshape(-1, QK_DIM)
    if rows.dtype == torch.uint8:
        rows = rows.view(FP8_DTYPE)
    rows = rows.double()
    if kv_scale is not None:
        rows = rows * float(kv_scale)
    return rows
