"""The CPU reference (the op's CPU implementation) against an independent brute force."""

import pytest
import torch

from conftest import brute_force_verify, relative_error
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

CASES = [
    # prefix lengths, draft lengths, heads
    ([7], [5], 2),
    ([0, 12, 3], [4, 1, 6], 3),
    ([9, 0], [0, 3], 2),  # a request with no drafts, one with no prefix
    ([70, 2, 65], [8, 2, 9], 1),  # crosses a 64-key tile
]


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_matches_brute_force(layout, case, dtype):
    prefix, drafts, heads = case
    vb = make_verify_batch(prefix, drafts, heads, layout=layout, dtype=dtype, pad_rows=2, seed=len(prefix) * 7 + heads)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    ref_out, ref_lse = brute_force_verify(vb)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert relative_error(out, ref_out) < 1e-2
    valid = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[valid].double(), ref_lse[valid], atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.isinf(lse), ~valid)


def test_layouts_agree_on_the_same_tree():
    prefix, drafts = [11, 0, 40], [6, 5, 13]
    results = {}
    for layout in ("full", "qlen", "packed"):
        vb = make_verify_batch(prefix, drafts, 4, layout=layout, seed=3)  # same seed: same tree and data
        results[layout] = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    for layout in ("qlen", "packed"):
        assert torch.equal(results[layout][0], results["full"][0])
        assert torch.equal(results[layout][1], results["full"][1])


@pytest.mark.parametrize("packed_dtype", [torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64])
def test_packed_dtypes_read_raw_bits(packed_dtype):
    width = {torch.uint8: 8, torch.int16: 16, torch.uint16: 16, torch.int32: 32, torch.uint32: 32, torch.int64: 64}[packed_dtype]
    # A chain of `width` drafts sets the top bit of the last row (negative as a signed integer).
    vb = make_verify_batch([3], [width], 1, layout="packed", packed_dtype=packed_dtype, chain=True, seed=width)
    ref = make_verify_batch([3], [width], 1, layout="full", chain=True, seed=width)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    ref_out, ref_lse = mla_tree_verify(ref.q, ref.kv_cache, **ref.kwargs())
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_kv_cache_3d_and_strided_rows_match_2d():
    vb = make_verify_batch([20, 5], [4, 3], 2, seed=5)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    wide = torch.randn(vb.kv_cache.shape[0], 1, 640).to(vb.kv_cache.dtype)
    wide[:, 0, :576] = vb.kv_cache
    strided = wide[:, :, :576]  # row stride 640, as a slice of a wider pool
    out3, lse3 = mla_tree_verify(vb.q, strided, **vb.kwargs())
    assert torch.equal(out, out3) and torch.equal(lse, lse3)


def test_strided_q_matches_contiguous():
    vb = make_verify_batch([9, 30], [3, 5], 4, seed=6)
    big = torch.randn(vb.q.shape[0], 6, 600).to(vb.q.dtype)
    big[:, 1:5, 10:586] = vb.q
    strided = big[:, 1:5, 10:586]
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    out_s, lse_s = mla_tree_verify(strided, vb.kv_cache, **vb.kwargs())
    assert torch.equal(out, out_s) and torch.equal(lse, lse_s)
