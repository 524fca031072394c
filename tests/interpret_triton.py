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
from ddtree_op.backends.sm90.persistent_combine import combine_persistent  # noqa: E402
from ddtree_op.backends.sm90.persistent_schedule import plan  # noqa: E402
from ddtree_op.backends.triton.attention import tree_attention_triton  # noqa: E402
from ddtree_op.prep import verify_plan  # noqa: E402

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
# The persistent kernel's combine, with equal shares and with pieces of 3 splits: partials where
# the reference plan puts them, NaN in every other slot; rows of row blocks written whole (by the
# kernel itself) stay untouched. The combine finds them in the preparation's plan (its CPU twin).
heads = 16
for qo, kv, ctas, splits, want_equal in [([0, 4, 8, 9], [0, 5117, 8953, 9053], 5, 1, True),  # 40, 30, 1 units
                                         ([0, 4, 12, 13], [0, 304, 1312, 1363], 7, 3, False),  # 3, 8, 1 units
                                         ([0, 0, 4, 12, 13], [0, 700, 6000, 9000, 9100], 3, 1, True),  # no drafts, 42, 24, 1
                                         ([0, 20, 40, 60], [0, 3020, 3740, 12760], 10, 1, True)]:  # lane by lane: 5 row blocks each
    equal, segments = plan(qo, kv, heads, ctas, splits)
    part_out = torch.full((2 * ctas, 64, 512), float("nan"))
    part_lse = torch.full((2 * ctas, 64), float("nan"))
    pieces = {}
    for cta_segments in segments:
        for seg in cta_segments:
            if seg.slot is not None:
                part_out[seg.slot] = torch.randn(64, 512, generator=gen)
                part_lse[seg.slot] = torch.randn(64, generator=gen)
                pieces.setdefault((seg.request, seg.block), []).append(seg.slot)
    empty_slot = max(pieces.values(), key=len)[1]
    part_lse[empty_slot], part_out[empty_slot] = float("-inf"), float("nan")  # a piece that saw no key
    out = torch.full((qo[-1] + 1, heads, 512), float("nan"))
    lse = torch.full((qo[-1] + 1, heads), float("nan"))
    schedule_plan = verify_plan(torch.tensor(qo), torch.tensor(kv, dtype=torch.int32), out.shape[0], heads, ctas, splits)
    combine_persistent(part_out, part_lse, torch.tensor(qo), schedule_plan, out, lse, ctas, splits)
    ok = equal == want_equal and len(pieces) >= 2
    touched = torch.zeros(out.shape[0] * heads, dtype=torch.bool)
    for (b, j), slots in pieces.items():
        rows = torch.arange(qo[b] * heads + 64 * j, min(qo[b + 1] * heads, qo[b] * heads + 64 * (j + 1)))
        local = rows - rows[0]
        live = [s for s in slots if s != empty_slot]
        weight = torch.softmax(part_lse[live][:, local], dim=0)
        want = (weight[:, :, None] * part_out[live][:, local]).sum(0)
        ok &= torch.allclose(out.reshape(-1, 512)[rows], want, atol=1e-5)
        ok &= torch.allclose(lse.reshape(-1)[rows], torch.logsumexp(part_lse[live][:, local], 0), atol=1e-5)
        touched[rows] = True
    ok &= bool(torch.isnan(out.reshape(-1, 512)[~touched]).all() and torch.isnan(lse.reshape(-1)[~touched]).all())
    failures += not ok
    print(f"persistent combine ({'equal shares' if equal else f'pieces of {splits} splits'}), {len(pieces)} row blocks "
          f"merged (one piece empty), other rows untouched: {'ok' if ok else 'FAIL'}")
print("interpreter: all cases match" if failures == 0 else f"interpreter: {failures} cases FAILED")
sys.exit(1 if failures else 0)
