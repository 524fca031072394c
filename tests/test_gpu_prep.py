"""CUDA preparation kernels (combined indices, compact mask, the fused launch) against the CPU ops."""

import pytest
import torch

from conftest import needs_cuda
from ddtree_op import ops
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch
from test_prep import INDEX_CASES, check_prepare_verify_writes_the_plan
from test_prep import test_build_verify_indices_matches_loop as check_index_builder
from test_prep import test_prepare_verify_returns_both_steps as check_prepare_verify

pytestmark = needs_cuda


@pytest.mark.parametrize("prefix,drafts", INDEX_CASES)
def test_build_verify_indices_cuda(prefix, drafts):
    for dtypes in [(torch.int32, torch.int64), (torch.int64, torch.int32)]:
        check_index_builder(prefix, drafts, dtypes, device="cuda")


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("packed_dtype", [torch.uint8, torch.int16, torch.int64])
@pytest.mark.parametrize("use_mask_indptr", [True, False])
def test_convert_tree_mask_cuda_matches_cpu(layout, packed_dtype, use_mask_indptr):
    if layout == "full" and not use_mask_indptr:
        pytest.skip("the full layout needs mask_indptr")
    width = {torch.uint8: 8, torch.int16: 16, torch.int64: 64}[packed_dtype]
    gen = torch.Generator().manual_seed(width)
    drafts = [min(width, n) for n in (5, 0, 70, 1, 64)] if layout == "packed" else [5, 0, 70, 1, 64]
    prefix = [3, 9, 0, 100, 1]
    visibility = [torch.rand(n, n, generator=gen) < 0.5 for n in drafts]  # bits above the diagonal too
    mask, mask_indptr = encode_tree_mask(visibility, prefix, layout, packed_dtype, torch.bool)
    qo = torch.tensor([0] + drafts).cumsum(0)
    kv = torch.tensor([0] + prefix).cumsum(0).int()
    mask_indptr = mask_indptr if use_mask_indptr else None
    rows = sum(drafts) + 5
    for words in (1, 2):
        want = ops.convert_tree_mask(mask, mask_indptr, qo, kv, layout, rows, words)
        got = ops.convert_tree_mask(mask.cuda(), None if mask_indptr is None else mask_indptr.cuda(), qo.cuda(), kv.cuda(), layout, rows, words)
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_prepare_verify_cuda_matches_cpu(layout):
    """The fused preparation launch (index blocks, then mask blocks) against the CPU steps."""
    check_prepare_verify(layout, device="cuda")
    for prefix, drafts in INDEX_CASES:  # ragged, empty requests, no prefix
        if layout == "packed" and max(drafts, default=0) > 64:
            continue
        vb = make_verify_batch(list(prefix), list(drafts), 1, layout=layout, pad_rows=3, device="cuda", seed=len(prefix))
        rows = vb.q.shape[0]
        for words in (1, 2):
            got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                     vb.mask_indptr, layout, rows, words)
            cpu = [t.cpu() for t in (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask)]
            mask_indptr = None if vb.mask_indptr is None else vb.mask_indptr.cpu()
            want = ops.prepare_verify(*cpu, mask_indptr, layout, rows, words)
            for g, w in zip(got, want):
                assert torch.equal(g.cpu(), w)


def test_prepare_verify_cuda_writes_the_plan():
    check_prepare_verify_writes_the_plan(device="cuda")


@pytest.mark.parametrize("seed", range(40))
def test_verify_plan_cuda_matches_cpu(seed):
    """The plan-only launch against the CPU twin: ragged, empty and zero-draft requests, B up to
    1023 (two chunks of the scan), padding rows, several schedules."""
    import random

    from ddtree_op.prep import verify_plan

    rng = random.Random(seed)
    batch = rng.choice([0, 1, 2, 7, 64, 511, 512, 513, 1000, 1023])
    drafts = [rng.choice([0, 1, 4, 16, 64]) for _ in range(batch)]
    keys = [n + rng.choice([0, 5, 128, 1000, 70000]) for n in drafts]
    qo = torch.tensor([0] + drafts).cumsum(0)
    vi = torch.tensor([0] + keys).cumsum(0).int()
    heads, ctas, splits = rng.choice([1, 16, 128]), rng.choice([1, 5, 132]), rng.choice([1, 2, 40])
    rows = int(qo[-1]) + rng.choice([0, 3, 100])
    for qo_dtype in (torch.int32, torch.int64):
        got = torch.ops.ddtree_cuda.verify_plan(qo.to(qo_dtype).cuda(), vi.cuda(), rows, heads, ctas, splits)
        assert torch.equal(got.cpu(), verify_plan(qo, vi, rows, heads, ctas, splits)), (batch, heads, ctas, splits)


def test_prepare_verify_cuda_plan_of_many_requests():
    """1000 requests (the scan in two chunks) through the preparation launch."""
    from ddtree_op import backends, contract
    from ddtree_op.prep import verify_plan

    drafts = [(b * 7) % 17 for b in range(1000)]
    prefix = [(b * 131) % 3000 for b in range(1000)]
    vb = make_verify_batch(prefix, drafts, 16, layout="qlen", pad_rows=4, device="cuda", seed=9)
    rows = vb.q.shape[0]
    plan = torch.empty(contract.plan_numel(rows, 16, 1000), dtype=torch.long, device="cuda")
    got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "qlen",
                             rows, 1, vb.kv_cache.shape[0], 0, None, plan, 16)
    ctas, splits = backends.plan_schedule(plan.device, rows, 16, 1000, vb.kv_indices.numel() + vb.out_cache_loc.numel())
    assert torch.equal(plan.cpu(), verify_plan(got[3].cpu(), got[0].cpu(), rows, 16, ctas, splits))
