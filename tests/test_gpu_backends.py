"""Backend choice on a GPU: "auto" picks the sm_90a kernel on sm_90 and sends inputs it does not
accept to the Triton kernel; the sm_90a kernel, asked for explicitly, refuses them."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import ATTENTION_CASES, assert_matches_reference, make_gpu_case, run_and_reference
from ddtree_op import mla_tree_verify

pytestmark = needs_cuda


def test_auto_backend_is_the_sm90_kernel_on_sm90(monkeypatch, fresh_dispatch):
    from ddtree_op.backends import DISABLE_SM90_ENV, auto_cuda_backend

    device = torch.device("cuda")
    assert auto_cuda_backend(device) == ("sm90" if torch.cuda.get_device_capability(device) == (9, 0) else "triton")
    monkeypatch.setenv(DISABLE_SM90_ENV, "1")
    fresh_dispatch()  # the environment is read once per process
    assert auto_cuda_backend(device) == "triton"


def test_auto_sends_misaligned_rows_to_triton():
    """q whose rows are not 16-byte aligned: 'auto' still answers (the Triton kernel takes any
    strides); the sm_90a kernel, asked for explicitly, refuses naming the argument."""
    vb = make_gpu_case(ATTENTION_CASES[4], "full", torch.bfloat16, seed=4)
    flat = torch.empty(vb.q.numel() + 1, device="cuda", dtype=vb.q.dtype)
    shifted = flat[1:].view(vb.q.shape)
    shifted.copy_(vb.q)
    vb.q = shifted
    assert_matches_reference(*run_and_reference(vb, "auto"))
    if torch.cuda.get_device_capability() == (9, 0):
        with pytest.raises(RuntimeError, match="argument 'q'"):
            run_and_reference(vb, "sm90")


def test_auto_sends_misaligned_out_rows_to_triton():
    """An out view whose rows are 4- but not 16-byte aligned (the sm_90a epilogue stores 16-byte
    pieces): 'auto' writes it correctly; 'sm90', asked for explicitly, refuses naming 'out'."""
    vb = make_gpu_case(ATTENTION_CASES[4], "full", torch.bfloat16, seed=5)
    rows, heads = vb.q.shape[0], vb.q.shape[1]
    wide = torch.full((rows, heads, 520), float("nan"), device="cuda", dtype=vb.q.dtype)
    out = wide[..., 2:514]
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend="auto")
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert_matches_reference(out, lse, ref_out, ref_lse)
    assert torch.isnan(wide[..., :2]).all() and torch.isnan(wide[..., 514:]).all()  # nothing outside the view
    if torch.cuda.get_device_capability() == (9, 0):
        with pytest.raises(RuntimeError, match="argument 'out'"):
            mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend="sm90")
