"""Property tests (hypothesis): random ragged batches, masks and layouts; the op's CPU path
against the independent brute force."""

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import brute_force_verify, needs_cuda, relative_error
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch


@st.composite
def verify_steps(draw):
    batch = draw(st.integers(1, 4))
    prefix = draw(st.lists(st.integers(0, 80), min_size=batch, max_size=batch))
    drafts = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    layout = draw(st.sampled_from(["full", "qlen", "packed"]))
    heads = draw(st.sampled_from([1, 2, 3]))
    seed = draw(st.integers(0, 2**16))
    arbitrary = draw(st.booleans())  # any bit pattern, not only trees (bits above the diagonal)
    vb = make_verify_batch(prefix, drafts, heads, layout=layout, seed=seed, pad_rows=draw(st.integers(0, 3)),
                           packed_dtype=torch.int16, index_dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    if arbitrary:
        gen = torch.Generator().manual_seed(seed + 1)
        vb.visibility = [torch.rand(n, n, generator=gen) < 0.5 for n in drafts]
        vb.tree_mask, vb.mask_indptr = encode_tree_mask(vb.visibility, prefix, layout, torch.int16)
    return vb


@settings(max_examples=40, deadline=None)
@given(verify_steps())
def test_reference_equals_brute_force_on_random_steps(vb):
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    ref_out, ref_lse = brute_force_verify(vb)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-4, rtol=1e-4)
    if ref_out.norm() > 0:
        assert relative_error(out, ref_out) < 1e-2
    assert torch.all(out[~finite] == 0)


def _to_cuda(vb):
    for name in ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "tree_mask", "mask_indptr"):
        value = getattr(vb, name)
        if value is not None:
            setattr(vb, name, value.cuda())
    return vb


@needs_cuda
@settings(max_examples=30, deadline=None)
@given(verify_steps(), st.sampled_from(["triton", "sm90"]))
def test_cuda_kernels_equal_reference_on_random_steps(vb, backend):
    from gpu_cases import cuda_backends

    assume(backend in cuda_backends())  # the sm_90a kernel runs on sm_90 only
    vb = _to_cuda(vb)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend=backend)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    if ref_out.float().norm() > 0:
        assert relative_error(out, ref_out) < 2e-2
