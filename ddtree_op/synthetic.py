"""Synthetic verify steps shaped like SGLang's target-verify buffers (demo, tests, benchmarks).

Trees are built the way SGLang builds them: node 0 is the root, every other node's parent has a
smaller index, and draft row i sees itself and its ancestors. The FULL mask also sets every
prefix column. Slots are scattered over a pool larger than the tokens in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .contract import PACKED_MASK_BITS, QK_DIM

DEEPSEEK_V3_SM_SCALE = 0.1352  # softmax scale of DeepSeek-V3's absorbed MLA (with YaRN mscale)


def random_tree_parents(num_nodes: int, gen: torch.Generator, chain: bool = False) -> list[int]:
    """parents[i] < i for i > 0; parents[0] = -1. `chain` gives a linear draft (EAGLE chain)."""
    if chain:
        return [i - 1 for i in range(num_nodes)]
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]


def tree_visibility(parents: list[int]) -> torch.Tensor:
    """bool [n, n]: row i sees column j iff j is i or one of i's ancestors."""
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parents[j]
    return vis


def pack_rows(vis: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One integer per row of `vis`, bit j = vis[:, j] (SGLang's QLEN_ONLY_BITPACKING)."""
    n = vis.shape[1]
    if n > PACKED_MASK_BITS[dtype]:
        raise ValueError(f"{n} drafts do not fit a {dtype} packed mask")
    words = (vis.long() << torch.arange(n)).sum(-1)  # bit 63 wraps, which keeps the raw bits
    width = PACKED_MASK_BITS[dtype]
    if dtype == torch.uint8 or width == 64:
        return words.to(dtype)
    # Wrap into the signed type of the same width, then reinterpret, so no bit is lost.
    signed = {16: torch.int16, 32: torch.int32}[width]
    words = torch.where(words >= 2 ** (width - 1), words - 2**width, words)
    return words.to(signed).view(dtype)


def encode_tree_mask(visibility: list[torch.Tensor], prefix_lens: list[int], layout: str, packed_dtype=torch.int64, mask_dtype=torch.bool):
    """(tree_mask, mask_indptr or None) in one of SGLang's three layouts, on the CPU."""
    if layout == "packed":
        rows = [pack_rows(v, packed_dtype) for v in visibility]
        return torch.cat(rows) if rows else torch.zeros(0, dtype=packed_dtype), None
    blocks = []
    for vis, prefix in zip(visibility, prefix_lens):
        if layout == "full":
            block = torch.ones(vis.shape[0], prefix + vis.shape[0], dtype=torch.bool)
            block[:, prefix:] = vis
        else:
            block = vis
        blocks.append(block.reshape(-1))
    sizes = torch.tensor([0] + [b.numel() for b in blocks], dtype=torch.long)
    mask = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool)
    return mask.to(mask_dtype), torch.cumsum(sizes, 0)


@dataclass
class VerifyBatch:
    """Inputs of one verify step plus the trees that made them (for independent references)."""

    q: torch.Tensor
    kv_cache: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    tree_mask: torch.Tensor
    mask_indptr: torch.Tensor | None
    mask_layout: str
    sm_scale: float
    prefix_lens: list[int]
    draft_lens: list[int]
    visibility: list[torch.Tensor]

    def kwargs(self) -> dict:
        """Keyword arguments of `mla_tree_verify` (after q and kv_cache)."""
        return dict(
            qo_indptr=self.qo_indptr,
            kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices,
            out_cache_loc=self.out_cache_loc,
            tree_mask=self.tree_mask,
            mask_indptr=self.mask_indptr,
            sm_scale=self.sm_scale,
            mask_layout=self.mask_layout,
        )


def make_verify_batch(
    prefix_lens: list[int],
    draft_lens: list[int],
    heads: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    layout: str = "full",
    seed: int = 0,
    pad_rows: int = 0,
    chain: bool = False,
    packed_dtype: torch.dtype = torch.int64,
    index_dtype: torch.dtype = torch.int32,
    extra_slots: int = 64,
    kv_cache_3d: bool = False,
) -> VerifyBatch:
    """A random verify step: scattered slots, random trees, random q and KV (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    total_prefix, total_draft = sum(prefix_lens), sum(draft_lens)
    num_slots = total_prefix + total_draft + extra_slots
    slots = torch.randperm(num_slots, generator=gen)
    prefix_slots, draft_slots = slots[:total_prefix], slots[total_prefix : total_prefix + total_draft]

    kv_indptr = torch.tensor([0] + prefix_lens, dtype=torch.long).cumsum(0)
    qo_indptr = torch.tensor([0] + draft_lens, dtype=torch.long).cumsum(0)
    # SGLang's kv_indices buffer is longer than what the batch uses; the tail is garbage.
    kv_indices = torch.cat([prefix_slots, torch.randint(0, num_slots, (7,), generator=gen)])
    visibility = [tree_visibility(random_tree_parents(n, gen, chain)) for n in draft_lens]
    tree_mask, mask_indptr = encode_tree_mask(visibility, prefix_lens, layout, packed_dtype)

    rows = total_draft + pad_rows
    q = torch.randn(rows, heads, QK_DIM, generator=gen).to(dtype)
    kv = torch.randn(num_slots, QK_DIM, generator=gen).to(dtype)
    if kv_cache_3d:
        kv = kv.view(num_slots, 1, QK_DIM)
    dev = torch.device(device)
    return VerifyBatch(
        q=q.to(dev),
        kv_cache=kv.to(dev),
        qo_indptr=qo_indptr.to(dev, index_dtype),
        kv_indptr=kv_indptr.to(dev, index_dtype),
        kv_indices=kv_indices.to(dev, index_dtype),
        out_cache_loc=draft_slots.to(dev, torch.int64),
        tree_mask=tree_mask.to(dev),
        mask_indptr=None if mask_indptr is None else mask_indptr.to(dev, torch.int64),
        mask_layout=layout,
        sm_scale=DEEPSEEK_V3_SM_SCALE,
        prefix_lens=list(prefix_lens),
        draft_lens=list(draft_lens),
        visibility=visibility,
    )
