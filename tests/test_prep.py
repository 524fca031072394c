"""Combined-index builder and mask conversion against plain Python loops."""

import pytest
import torch

from ddtree_op import ops
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch, random_tree_parents, tree_visibility


def loop_verify_indices(qo_indptr, kv_indptr, kv_indices, out_cache_loc):
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    indptr, slots = [0], []
    for b in range(len(qo) - 1):
        keys = kv_indices[kv[b] : kv[b + 1]].tolist() + out_cache_loc[qo[b] : qo[b + 1]].tolist()
        slots += keys
        indptr.append(indptr[-1] + len(keys))
    return indptr, slots


INDEX_CASES = [
    ([3, 0, 7], [2, 5, 1]),  # ragged, P = 0
    ([4, 6], [0, 3]),  # n = 0
    ([0], [0]),  # nothing at all
    ([100, 1, 17, 64], [16, 4, 1, 7]),
    ([], []),  # B = 0
]


@pytest.mark.parametrize("prefix,drafts", INDEX_CASES)
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int64), (torch.int64, torch.int32), (torch.int64, torch.int64)])
def test_build_verify_indices_matches_loop(prefix, drafts, dtypes, device="cpu"):
    indptr_dtype, slot_dtype = dtypes
    gen = torch.Generator().manual_seed(len(prefix))
    kv_indptr = torch.tensor([0] + prefix).cumsum(0).to(indptr_dtype)
    qo_indptr = torch.tensor([0] + drafts).cumsum(0).to(torch.int64 if indptr_dtype == torch.int32 else torch.int32)
    kv_indices = torch.randint(0, 1 << 20, (sum(prefix) + 5,), generator=gen).to(slot_dtype)  # longer than used
    out_cache_loc = torch.randint(0, 1 << 20, (sum(drafts) + 3,), generator=gen).to(slot_dtype)
    args = [t.to(device) for t in (qo_indptr, kv_indptr, kv_indices, out_cache_loc)]
    verify_indptr, verify_indices = ops.build_verify_indices(*args)
    want_indptr, want_slots = loop_verify_indices(qo_indptr, kv_indptr, kv_indices, out_cache_loc)
    assert verify_indptr.dtype == torch.int32 and verify_indices.dtype == torch.int32
    assert verify_indptr.tolist() == want_indptr
    assert verify_indices.numel() == kv_indices.numel() + out_cache_loc.numel()
    assert verify_indices[: want_indptr[-1]].tolist() == want_slots


def test_kv_indptr_longer_than_batch_reads_only_b_plus_1():
    qo = torch.tensor([0, 2])
    kv = torch.tensor([0, 3, 999])  # entries past B+1 are not read
    verify_indptr, verify_indices = ops.build_verify_indices(qo, kv, torch.arange(10, 20), torch.tensor([7, 8]))
    assert verify_indptr.tolist() == [0, 5]
    assert verify_indices[:5].tolist() == [10, 11, 12, 7, 8]


def loop_mask_words(visibility, num_rows, words):
    out = torch.zeros(num_rows, words, dtype=torch.long)
    row = 0
    for vis in visibility:
        for i in range(vis.shape[0]):
            value = [0] * words
            for j in range(vis.shape[1]):
                if vis[i, j]:
                    value[j // 64] |= 1 << (j % 64)
            out[row] = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in value])
            row += 1
    return out


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("drafts", [[5, 0, 3], [64, 1], [70, 2]])
def test_convert_tree_mask_matches_loop(layout, drafts):
    if layout == "packed" and max(drafts) > 64:
        pytest.skip("packed masks hold at most 64 drafts")
    gen = torch.Generator().manual_seed(sum(drafts))
    prefix = [4 * (b + 1) for b in range(len(drafts))]
    visibility = [torch.rand(n, n, generator=gen) < 0.5 for n in drafts]  # arbitrary bits, above the diagonal too
    mask, mask_indptr = encode_tree_mask(visibility, prefix, layout, torch.int64, torch.uint8)
    qo = torch.tensor([0] + drafts).cumsum(0)
    kv = torch.tensor([0] + prefix).cumsum(0).int()
    num_rows = sum(drafts) + 3  # padding rows stay 0
    words = 2 if max(drafts) > 64 else 1
    got = ops.convert_tree_mask(mask, mask_indptr, qo, kv, layout, num_rows, words)
    assert torch.equal(got, loop_mask_words(visibility, num_rows, words))


def test_qlen_without_mask_indptr_uses_cumulative_blocks():
    visibility = [tree_visibility(random_tree_parents(n, torch.Generator().manual_seed(n))) for n in (3, 5)]
    mask, mask_indptr = encode_tree_mask(visibility, [0, 0], "qlen")
    qo, kv = torch.tensor([0, 3, 8]), torch.tensor([0, 2, 9])
    with_ptr = ops.convert_tree_mask(mask, mask_indptr, qo, kv, "qlen", 8, 1)
    without = ops.convert_tree_mask(mask, None, qo, kv, "qlen", 8, 1)
    assert torch.equal(with_ptr, without)


def test_full_layout_row_stride_is_prefix_plus_drafts():
    # A wrong stride (n instead of P + n) would read prefix columns (all ones) as draft bits.
    vb = make_verify_batch([37], [6], 1, layout="full", chain=True)
    words = ops.convert_tree_mask(vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, "full", 6, 1)
    assert words[:, 0].tolist() == [(1 << (i + 1)) - 1 for i in range(6)]


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_prepare_verify_returns_both_steps(layout, device="cpu"):
    vb = make_verify_batch([7, 0, 19], [3, 5, 2], 2, layout=layout, pad_rows=2, device=device, seed=3)
    rows, words = vb.q.shape[0], 1
    got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr,
                             layout, rows, words)
    cpu = [t.cpu() for t in (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc)]
    want_indptr, want_indices = ops.build_verify_indices(*cpu)
    want_words = ops.convert_tree_mask(vb.tree_mask.cpu(), None if vb.mask_indptr is None else vb.mask_indptr.cpu(),
                                       cpu[0], cpu[1], layout, rows, words)
    assert [t.device.type for t in got] == [torch.device(device).type] * 4
    assert torch.equal(got[3].cpu(), vb.qo_indptr.int().cpu())  # valid inputs: the sanitized qo_indptr is the raw one
    assert torch.equal(got[0].cpu(), want_indptr)
    assert torch.equal(got[1].cpu(), want_indices)
    assert torch.equal(got[2].cpu(), want_words)


def check_prepare_verify_writes_the_plan(device="cpu"):
    """prepare_verify's schedule plan is verify_plan of the batch it returns (the sanitized one),
    for the CTAs and splits the sm90 backend picks from the shapes on the device."""
    from ddtree_op import backends, contract
    from ddtree_op.prep import verify_plan

    for prefix, drafts, heads, pad_rows in [([7, 0, 19], [3, 5, 2], 2, 2), ([3000, 40, 0, 9000], [16, 0, 4, 64], 16, 5),
                                            ([5], [1], 128, 0), ([], [], 16, 3)]:
        vb = make_verify_batch(prefix, drafts, heads, layout="full", pad_rows=pad_rows, device=device, seed=len(prefix))
        rows, batch = vb.q.shape[0], len(prefix)
        plan = torch.full((contract.plan_numel(rows, heads, batch),), -7, dtype=torch.long, device=device)
        got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr,
                                 "full", rows, 1, vb.kv_cache.shape[0], 0, None, plan, heads)
        ctas, splits = backends.plan_schedule(torch.device(device), rows, heads, batch,
                                              vb.kv_indices.numel() + vb.out_cache_loc.numel())
        want = verify_plan(got[3].cpu(), got[0].cpu(), rows, heads, ctas, splits)
        assert torch.equal(plan.cpu(), want), (prefix, drafts, heads)


def test_prepare_verify_writes_the_plan():
    check_prepare_verify_writes_the_plan()


def test_prepare_verify_plan_of_a_sanitized_batch():
    """A decreasing qo_indptr: the plan is that of the sanitized batch (later requests void, rows padding)."""
    from ddtree_op import contract
    from ddtree_op.prep import verify_plan

    vb = make_verify_batch([40, 9, 300], [4, 6, 3], 16, layout="full", pad_rows=2, seed=5)
    qo = vb.qo_indptr.clone()
    qo[2] = 1  # decreasing
    rows = vb.q.shape[0]
    plan = torch.empty(contract.plan_numel(rows, 16, 3), dtype=torch.long)
    got = ops.prepare_verify(qo, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "full", rows, 1,
                             vb.kv_cache.shape[0], 0, None, plan, 16)
    assert got[3].tolist() == [0, 4, 4, 4]
    assert torch.equal(plan, verify_plan(got[3], got[0], rows, 16, 1, plan[contract.PLAN_SPLITS].item()))
    assert plan[contract.PLAN_ROW_BLOCKS] == 1  # the first request's 64 rows
