"""Contract semantics on the CPU reference: padding rows, empty rows, masks above the diagonal."""

import torch

from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch


def _with_mask(vb, visibility):
    vb.tree_mask, vb.mask_indptr = encode_tree_mask(visibility, vb.prefix_lens, vb.mask_layout)
    vb.visibility = visibility
    return vb


def test_padding_rows_are_zero_and_minus_inf():
    vb = make_verify_batch([6, 2], [3, 2], 4, pad_rows=5)
    out = torch.full((vb.q.shape[0], 4, 512), float("nan"), dtype=vb.q.dtype)
    lse = torch.full((vb.q.shape[0], 4), float("nan"))
    mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse)
    assert torch.all(out[5:] == 0) and torch.all(lse[5:] == float("-inf"))
    assert torch.isfinite(lse[:5]).all() and not torch.isnan(out).any()


def test_fully_masked_draft_row_without_prefix_is_zero():
    vb = make_verify_batch([0], [3], 2)
    vis = vb.visibility[0].clone()
    vis[1] = False  # row 1 sees nothing at all
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **_with_mask(vb, [vis]).kwargs())
    assert torch.all(out[1] == 0) and torch.all(lse[1] == float("-inf"))
    assert torch.isfinite(lse[[0, 2]]).all() and not torch.isnan(out).any()


def test_fully_masked_draft_row_with_prefix_is_prefix_only_attention():
    vb = make_verify_batch([9], [3], 2, seed=4)
    vis = vb.visibility[0].clone()
    vis[2] = False  # DDTree padding node: sees only the prefix
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **_with_mask(vb, [vis]).kwargs())
    prefix = vb.kv_cache[vb.kv_indices[:9].long()].float()
    scores = prefix @ vb.q[2].float().T * vb.sm_scale  # [9, H]
    torch.testing.assert_close(lse[2], torch.logsumexp(scores, 0), atol=1e-4, rtol=1e-4)
    want = torch.softmax(scores, 0).T @ prefix[:, :512]
    torch.testing.assert_close(out[2].float(), want, atol=2e-2, rtol=2e-2)


def test_bits_above_the_diagonal_are_honoured():
    vb = make_verify_batch([4], [4], 1, seed=8)
    lower = vb.visibility[0]
    upper = lower.clone()
    upper[0, 3] = True  # row 0 also sees draft 3 (a later node)
    out_lower, lse_lower = mla_tree_verify(vb.q, vb.kv_cache, **_with_mask(vb, [lower]).kwargs())
    out_upper, lse_upper = mla_tree_verify(vb.q, vb.kv_cache, **_with_mask(vb, [upper]).kwargs())
    assert not torch.equal(lse_upper[0], lse_lower[0])
    assert torch.equal(lse_upper[1:], lse_lower[1:])
    draft3 = vb.kv_cache[vb.out_cache_loc[3]].float()
    extra = torch.exp(vb.q[0, 0].float() @ draft3 * vb.sm_scale)
    torch.testing.assert_close(torch.exp(lse_upper[0, 0]), torch.exp(lse_lower[0, 0]) + extra, rtol=1e-4, atol=1e-4)


def test_requests_with_no_drafts_or_no_prefix():
    vb = make_verify_batch([0, 5, 0], [2, 0, 1], 3, pad_rows=1)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    assert torch.isfinite(lse[:3]).all()  # each root sees itself
    assert torch.all(lse[3] == float("-inf"))


def test_out_variant_writes_into_given_buffers():
    vb = make_verify_batch([5, 9], [3, 4], 2, pad_rows=1)
    out = torch.randn(vb.q.shape[0], 2, 512).to(vb.q.dtype)
    lse = torch.randn(vb.q.shape[0], 2)
    got_out, got_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    want_out, want_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
