"""Every CUDA backend against the float32 reference: the shape grid, edge shapes, padding-only
batches, 64-bit slot offsets, argument errors."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import ATTENTION_CASES, EDGE_CASES, assert_matches_reference, case_id, cuda_backends, make_gpu_case, run_and_reference
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

pytestmark = needs_cuda


@pytest.mark.parametrize("backend", cuda_backends())
@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_id)
def test_attention_matches_reference(backend, layout, case):
    if layout == "packed" and max(case[1]) > 64:
        pytest.skip("packed masks hold at most 64 drafts")
    for seed, dtype in enumerate([torch.bfloat16, torch.float16]):
        seed += 10 * ATTENTION_CASES.index(case) + len(layout)
        vb = make_gpu_case(case, layout, dtype, seed)
        assert_matches_reference(*run_and_reference(vb, backend))


@pytest.mark.parametrize("backend", cuda_backends())
@pytest.mark.parametrize("case", EDGE_CASES, ids=case_id)
def test_edge_shapes(backend, case):
    vb = make_gpu_case(case, "full", torch.bfloat16, seed=EDGE_CASES.index(case))
    assert_matches_reference(*run_and_reference(vb, backend))


@pytest.mark.parametrize("backend", cuda_backends())
def test_all_padding_batch(backend):
    vb = make_verify_batch([0, 0], [0, 0], 16, device="cuda", pad_rows=7)  # no draft rows at all
    out = torch.full((7, 16, 512), float("nan"), device="cuda", dtype=vb.q.dtype)
    lse = torch.full((7, 16), float("nan"), device="cuda")
    mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend=backend)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("backend", cuda_backends())
def test_slots_above_4m_need_64_bit_offsets(backend):
    """slot * 576 overflows int32 above 3.7M slots: a pool of ~5 GB with the batch at its top."""
    vb = make_verify_batch([3000, 20], [8, 5], 16, device="cuda", pad_rows=2, index_dtype=torch.int64)
    high = 4_300_000
    pool = torch.empty(high + vb.kv_cache.shape[0], 576, device="cuda", dtype=vb.kv_cache.dtype)
    pool[high:] = vb.kv_cache
    kwargs = vb.kwargs()
    kwargs["kv_indices"] = vb.kv_indices + high
    kwargs["out_cache_loc"] = vb.out_cache_loc + high
    out, lse = mla_tree_verify(vb.q, pool, **kwargs, backend=backend)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert_matches_reference(out, lse, ref_out, ref_lse)


def test_device_mismatch_names_argument():
    vb = make_verify_batch([5], [2], 1, device="cuda")
    kwargs = vb.kwargs()
    kwargs["kv_indices"] = kwargs["kv_indices"].cpu()
    with pytest.raises(ValueError, match="'kv_indices'"):
        mla_tree_verify(vb.q, vb.kv_cache, **kwargs)
