"""Runs the Triton attention kernel under TRITON_INTERPRET=1 (on the CPU) on FP8 e4m3 caches
(kv_scale as a float and as a device tensor, with and without key splits) and on paged batches,
against the reference; invoked by tests/test_fp8.py in a subprocess, since the variable must be
set before Triton is imported. q is fp16: the interpreter miscomputes bf16 dots. Prints one line
per case and 'interpreter: all cases match' at the end."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from ddtree_op import mla_tree_verify_paged, ops  # noqa: E402
from ddtree_op.api import mask_words_per_row  # noqa: E402
from ddtree_op.backends.triton.attention import tree_attention_triton  # noqa: E402
from ddtree_op.paged import prepare_paged  # noqa: E402
from ddtree_op.synthetic_paged import make_paged_batch  # noqa: E402

# (prefix lengths, draft lengths, heads, page size, splits, dv_parts, kv dtype, scale as a tensor, bad page ids)
CASES = [([5, 0, 70], [3, 4, 0], 4, 16, 1, 1, "fp8", False, False), ([40, 3, 9], [3, 4, 5], 2, 16, 3, 1, "fp8", True, True),
         ([0, 1], [2, 1], 16, 16, 2, 2, "fp8", True, False), ([60], [8], 3, 64, 1, 2, "uint8", False, True),
         ([300, 17], [5, 2], 2, 64, 5, 1, "same", False, True)]

failures = 0
for prefix, drafts, heads, page, splits, dv_parts, kv_dtype, scale_tensor, bad_pages in CASES:
    for layout in ("full", "packed"):
        pb = make_paged_batch(prefix, drafts, heads, page_size=page, dtype=torch.float16, kv_dtype=kv_dtype, layout=layout,
                              pad_rows=2, kv_scale_tensor=scale_tensor, seed=heads + splits)
        if bad_pages:  # request 0's first page out of range, and a length that does not fit: slots -1
            pb.block_table[0, 0] = pb.kv_cache.shape[0]
            pb.cache_seqlens[-1] = drafts[-1] - 1 if drafts[-1] > 0 else pb.cache_seqlens[-1]
        rows = pb.q.shape[0]
        words = mask_words_per_row(pb.tree_mask, layout, rows, None)
        verify_indptr, verify_indices, mask_words, qo = prepare_paged(pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask,
                                                                      pb.mask_indptr, layout, page, pb.kv_cache.shape[0], rows, words)
        pool = pb.kv_cache.reshape(-1, 576)
        if pool.dtype == torch.uint8:
            pool = pool.view(torch.float8_e4m3fn)
        tensor = pb.kv_scale if isinstance(pb.kv_scale, torch.Tensor) else None
        value = 1.0 if pb.kv_scale is None or tensor is not None else float(pb.kv_scale)
        ref_out, ref_lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
        out = torch.full_like(ref_out, float("nan"))
        lse = torch.full_like(ref_lse, float("nan"))
        tree_attention_triton(pb.q, pool, qo, verify_indptr, verify_indices, mask_words, pb.sm_scale, out, lse, block_m=16,
                              block_n=16, num_splits=splits, dv_parts=dv_parts, kv_scale=tensor, kv_scale_value=value)
        err = float((out.double() - ref_out.double()).norm() / ref_out.double().norm().clamp_min(1e-30))  # 0 when nothing is seen
        finite = torch.isfinite(ref_lse)
        ok = (err < 2e-3 and not torch.isnan(out).any() and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
              and torch.allclose(lse[finite], ref_lse[finite], atol=1e-3))
        failures += not ok
        print(f"{prefix} {drafts} H={heads} page={page} splits={splits} dv_parts={dv_parts} {kv_dtype} "
              f"scale {'tensor' if scale_tensor else 'float'}{' bad pages' if bad_pages else ''} {layout}: rel err {err:.1e} {'ok' if ok else 'FAIL'}")
# A kv_scale tensor changed in place is read again (what a CUDA-graph replay sees).
pb = make_paged_batch([33], [4], 2, page_size=16, dtype=torch.float16, kv_dtype="fp8", kv_scale_tensor=True, seed=9)
prepared = prepare_paged(pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask, pb.mask_indptr, "full", 16,
                         pb.kv_cache.shape[0], pb.q.shape[0], 1)
pool = pb.kv_cache.reshape(-1, 576)
results = []
for value in (0.05, 0.11):
    pb.kv_scale.fill_(value)
    out = torch.empty(pb.q.shape[0], 2, 512, dtype=torch.float16)
    lse = torch.empty(pb.q.shape[0], 2)
    tree_attention_triton(pb.q, pool, prepared[3], prepared[0], prepared[1], prepared[2], pb.sm_scale, out, lse, block_m=16,
                          block_n=16, num_splits=1, kv_scale=pb.kv_scale)
    ref_out, ref_lse = ops.tree_attention(pb.q, pool, prepared[3], prepared[0], prepared[1], prepared[2], pb.sm_scale, "reference",
                                          pb.kv_scale)
    results.append(float((out.double() - ref_out.double()).norm() / ref_out.double().norm()) < 2e-3)
ok = all(results)
failures += not ok
print(f"kv_scale tensor rewritten between launches: {'ok' if ok else 'FAIL'}")
if failures:
    raise SystemExit(f"interpreter: {failures} case(s) FAILED")
print("interpreter: all cases match")
