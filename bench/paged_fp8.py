"""Paged and FP8 inputs for a bench case (the bench scripts wire them in beside the slot-list
inputs): the same step as `Case` describes, in FlashMLA's paged layout and/or with an FP8 e4m3
cache, plus the byte count the FP8 floor is measured against."""

from __future__ import annotations

import torch

from ddtree_op.synthetic_paged import PagedBatch, make_paged_batch

FP8_KV_ROW_BYTES = 576  # one e4m3 latent+rope row
PAGE_SIZE = 64  # FlashMLA's page size: the fast path


def paged_inputs(case, *, kv_dtype: str = "same", page_size: int = PAGE_SIZE, layout: str = "full",
                 device: str = "cuda", seed: int = 0, kv_scale: float = 0.05) -> PagedBatch:
    """A paged verify step for `case` (a bench.cases.Case): kv_dtype "same" (bf16), "fp8" or
    "uint8" (e4m3 bytes); kv_scale as a device tensor, as a serving engine would hold it.
    Call `ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs())`."""
    return make_paged_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, page_size=page_size,
                            kv_dtype=kv_dtype, kv_scale=kv_scale if kv_dtype != "same" else None,
                            kv_scale_tensor=kv_dtype != "same", layout=layout, chain=case.chain, device=device, seed=seed,
                            extra_pages=0, extra_columns=0)


def fp8_slot_inputs(vb, *, kv_scale: float = 0.05):
    """The slot-list batch `vb` (ddtree_op.synthetic.VerifyBatch) with its cache in e4m3 and the
    kv_scale tensor: `mla_tree_verify(vb.q, cache, **vb.kwargs(), kv_scale=scale)`."""
    from ddtree_op.synthetic_paged import fp8_cache

    cache = fp8_cache(vb.kv_cache.float(), kv_scale)
    return cache, torch.tensor([kv_scale], dtype=torch.float32, device=cache.device)


def fp8_bytes(case) -> float:
    """Bytes of the step with an FP8 cache: case.bytes() with e4m3 KV rows."""
    from bench.cases import KV_ROW_BYTES

    keys = sum(p + n for p, n in zip(case.prefix_lens, case.draft_lens))
    return case.bytes() - keys * (KV_ROW_BYTES - FP8_KV_ROW_BYTES)
