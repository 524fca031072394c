"""Paged and FP8 inputs for a bench case (the bench scripts wire them in beside the slot-list
inputs): the same step as `Case` describes, in FlashMLA's paged layout and/or with an FP8 e4m3
cache, plus the byte count the FP8 floor is measured against. `python -m bench.paged_fp8
[CASE,...] [BACKEND]` times the whole step in the four variants on a GPU."""

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


def step_launches(case, variant: str, backend: str = "auto", seed: int = 0):
    """A launch (a no-argument callable) of the whole verify step of `case` in one of the
    variants "slot", "slot_fp8", "paged", "paged_fp8", with static out/lse buffers."""
    import ddtree_op
    from ddtree_op.synthetic import make_verify_batch

    max_draft = max(case.draft_lens)
    if variant.startswith("paged"):
        pb = paged_inputs(case, kv_dtype="fp8" if variant.endswith("fp8") else "same", seed=seed)
        out = torch.empty(pb.q.shape[0], case.heads, 512, dtype=pb.q.dtype, device="cuda")
        lse = torch.empty(pb.q.shape[0], case.heads, device="cuda")
        return lambda: ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=out, lse=lse, backend=backend,
                                                       max_draft_len=max_draft)
    vb = make_verify_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, device="cuda", seed=seed,
                           chain=case.chain, kv_cache_3d=True)
    cache, scale = (fp8_slot_inputs(vb) if variant.endswith("fp8") else (vb.kv_cache, None))
    out = torch.empty(vb.q.shape[0], case.heads, 512, dtype=vb.q.dtype, device="cuda")
    lse = torch.empty(vb.q.shape[0], case.heads, device="cuda")
    return lambda: ddtree_op.mla_tree_verify(vb.q, cache, **vb.kwargs(), out=out, lse=lse, backend=backend,
                                             max_draft_len=max_draft, kv_scale=scale)


VARIANTS = ("slot", "paged", "slot_fp8", "paged_fp8")


def main(argv=None) -> None:
    """Times the whole verify step per case in the four variants (CUDA-graph replays over
    rotating input sets, as bench/verify.py): `python -m bench.paged_fp8 [CASE,CASE,...] [BACKEND]`."""
    import sys

    from bench.cases import all_cases
    from bench.verify import input_set_count, time_graph

    argv = sys.argv[1:] if argv is None else argv
    names = set(argv[0].split(",")) if argv else None
    backend = argv[1] if len(argv) > 1 else "auto"
    print(f"{'case':28s} " + " ".join(f"{v:>11s}" for v in VARIANTS) + "   fp8/bf16 (slot, paged)")
    for case in all_cases():
        if names is not None and case.name not in names:
            continue
        sets = input_set_count(case)
        times = {v: time_graph([step_launches(case, v, backend, seed) for seed in range(sets)]) for v in VARIANTS}
        print(f"{case.name:28s} " + " ".join(f"{times[v] * 1e6:9.1f}us" for v in VARIANTS)
              + f"   {times['slot_fp8'] / times['slot']:.2f} {times['paged_fp8'] / times['paged']:.2f}", flush=True)


if __name__ == "__main__":
    main()
