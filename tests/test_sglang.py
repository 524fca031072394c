"""The SGLang adapter on metadata built the way SGLang's Triton backend builds it."""

import pytest
import torch

from conftest import brute_force_verify, needs_cuda, relative_error
from ddtree_op.sglang import target_verify_forward
from sglang_metadata import build_target_verify

DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def run_adapter(inp, **kwargs):
    return target_verify_forward(
        inp.q, inp.k_buffer, qo_indptr=inp.qo_indptr, kv_indptr=inp.kv_indptr, kv_indices=inp.kv_indices,
        custom_mask=inp.custom_mask, mask_indptr=inp.mask_indptr, out_cache_loc=inp.out_cache_loc,
        sm_scale=inp.sm_scale, num_draft_tokens=inp.num_draft_tokens, v_buffer=inp.v_buffer, **kwargs,
    )


def check_against_brute_force(inp, o):
    heads = inp.q.shape[1] // 576
    ref_out, _ = brute_force_verify(inp.as_verify_batch())
    rows = inp.real_rows
    got = o.view(-1, heads, 512)[:rows]
    assert not torch.isnan(got).any()
    assert relative_error(got.cpu(), ref_out[:rows]) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_draft", [4, 8])
def test_eager_target_verify(device, num_draft):
    inp = build_target_verify([37, 5, 120], num_draft, heads=2, device=device, seed=num_draft)
    assert inp.qo_indptr.dtype == torch.int32 and inp.kv_indices.dtype == torch.int64
    o = run_adapter(inp)
    assert o.shape == (inp.q.shape[0], 2 * 512)
    check_against_brute_force(inp, o)


@pytest.mark.parametrize("device", DEVICES)
def test_cuda_graph_layout_with_padding_requests(device):
    inp = build_target_verify([64, 9], 4, heads=2, cuda_graph=True, graph_bs=4, device=device, seed=3)
    assert inp.qo_indptr.dtype == torch.int64 and inp.custom_mask.dtype == torch.uint8
    assert inp.custom_mask.numel() > int(inp.mask_indptr[-1])  # preallocated for the largest context
    o = torch.full((inp.q.shape[0], 2 * 512), float("nan"), dtype=inp.q.dtype, device=device)
    assert run_adapter(inp, o=o) is o
    check_against_brute_force(inp, o)


def test_v_buffer_must_view_the_key_rows():
    inp = build_target_verify([8], 2, heads=1)
    inp.v_buffer = inp.k_buffer[..., :512].clone()  # same values, other memory
    with pytest.raises(ValueError, match="'v_buffer'"):
        run_adapter(inp)


def test_wrong_output_buffer_is_rejected():
    inp = build_target_verify([8], 2, heads=1)
    with pytest.raises(ValueError, match="'o'"):
        run_adapter(inp, o=torch.empty(inp.q.shape[0], 256, dtype=inp.q.dtype))
