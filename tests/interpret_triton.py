"""Runs the Triton kernels under TRITON_INTERPRET=1 (on the CPU) against the reference; invoked
by tests/test_triton_interpreter.py in a subprocess, since the variable must be set before Triton
is imported. Prints one line per case and 'interpreter: all cases match' at the end."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from ddtree_op import ops  # noqa: E402
from ddtree_op.api import mask_words_per_row  # noqa: E402
from ddtree_op.synthetic import make_verify_batch  # noqa: E402
from ddtree_op.backends.lse_merge import combine_splits  # noqa: E402
from ddtree_op.backends.triton.attention import tree_attention_triton  # noqa: E402

# (prefix lengths, draft lengths, heads, splits, dv_parts)
CASES = [([5, 0, 70], [3, 4, 0], 4, 1, 1), ([40, 3, 9], [3, 4, 5], 2, 3, 1), ([0, 1], [2, 1], 16, 2, 2), ([33], [9], 3, 1, 2),
         ([300, 17], [5, 2], 2, 40, 1)]  # 40 splits: the combine's split tile is padded to 64, several splits are empty

failures = 0
for prefix, drafts, heads, splits, dv_parts in CASES:
    for layout in ("full", "qlen", "packed"):
        vb = make_verify_batch(prefix, drafts, heads, layout=layout, pad_rows=2, dtype=torch.float16, seed=heads + splits)
        verify_indptr, verify_indices = ops.build_verify_indices(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc)
        words = ops.convert_tree_mask(vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, layout, vb.q.shape[0],
                                      mask_words_per_row(vb.tree_mask, layout, vb.q.shape[0], None))
        ref_out, ref_lse = ops.tree_attention(vb.q, vb.kv_cache, vb.qo_indptr, verify_indptr, verify_indices, words, vb.sm_scale)
        out = torch.full_like(ref_out, float("nan"))
        lse = torch.full_like(ref_lse, float("nan"))
        tree_attention_triton(vb.q, vb.kv_cache, vb.qo_indptr, verify_indptr, verify_indices, words, vb.sm_scale, out, lse,
                              block_m=16, block_n=16, num_splits=splits, dv_parts=dv_parts)
        err = float((out.double() - ref_out.double()).norm() / ref_out.double().norm())
        finite = torch.isfinite(ref_lse)
        ok = (err < 2e-3 and not torch.isnan(out).any() and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
              and torch.allclose(lse[finite], ref_lse[finite], atol=1e-3))
        failures += not ok
        print(f"{prefix} {drafts} H={heads} splits={splits} dv_parts={dv_parts} {layout}: rel err {err:.1e} {'ok' if ok else 'FAIL'}")
# The combine alone: a split that saw no key (lse -inf) may hold any bytes, NaN included, and rows
# past qo_indptr[B] are not written.
gen = torch.Generator().manual_seed(3)
part_out = torch.randn(3, 4 * 2, 512, generator=gen)
part_lse = torch.randn(3, 4 * 2, generator=gen)
part_lse[1], part_out[1] = float("-inf"), float("nan")
out = torch.full((4, 2, 512), float("nan"))
lse = torch.full((4, 2), float("nan"))
combine_splits(part_out, part_lse, torch.tensor([0, 3]), out, lse)
weight = torch.softmax(part_lse[[0, 2], :6], dim=0)
want_out = (weight[:, :, None] * part_out[[0, 2], :6]).sum(0).reshape(3, 2, 512)
ok = (torch.allclose(out[:3], want_out, atol=1e-5) and torch.allclose(lse[:3], torch.logsumexp(part_lse[[0, 2], :6], 0).reshape(3, 2))
      and torch.isnan(out[3]).all() and torch.isnan(lse[3]).all())
failures += not ok
print(f"combine with an empty split holding NaN, padding rows untouched: {'ok' if ok else 'FAIL'}")
# The same with slot 0 eager and the others late, read only where their LSE is live (the sm90
# pieces: slots past a row block's last piece have lse -inf and were never written).
out = torch.full((4, 2, 512), float("nan"))
lse = torch.full((4, 2), float("nan"))
combine_splits(part_out, part_lse, torch.tensor([0, 3]), out, lse, eager_slots=1)
ok = (torch.allclose(out[:3], want_out, atol=1e-5) and torch.allclose(lse[:3], torch.logsumexp(part_lse[[0, 2], :6], 0).reshape(3, 2))
      and torch.isnan(out[3]).all())
failures += not ok
print(f"combine of an eager slot and late slots: {'ok' if ok else 'FAIL'}")
print("interpreter: all cases match" if failures == 0 else f"interpreter: {failures} cases FAILED")
sys.exit(1 if failures else 0)
