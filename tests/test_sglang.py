"""The SGLang adapter on metadata built the way SGLang's Triton backend builds it."""

import pytest
import torch

from conftest import brute_force_verify, needs_cuda, relative_error
from ddtree_op.sglang import target_verify_forward
from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE
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


def _compiled_step(q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr, out_cache_loc):
    o = target_verify_forward(
        q, k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
        custom_mask=custom_mask, mask_indptr=mask_indptr, out_cache_loc=out_cache_loc, sm_scale=DEEPSEEK_V3_SM_SCALE, num_draft_tokens=4,
    )
    return o * 2  # surrounding work for inductor to fuse


# Three batch sizes, in the eager (int32 qo_indptr, bool mask) and the CUDA-graph layout (int64,
# preallocated uint8 mask, padding requests).
COMPILE_BATCHES = [[37], [5, 120], [64, 9, 3]]


@pytest.mark.parametrize("with_v_buffer", [False, True])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_adapter_compiles_fullgraph_without_recompiles(with_v_buffer, cuda_graph):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    # inductor once (the full stack), aot_eager for the other layouts (same tracing, faster on CPU)
    counter = CompileCounterWithBackend("inductor" if with_v_buffer and cuda_graph else "aot_eager")
    compiled = torch.compile(_compiled_step, backend=counter, fullgraph=True)
    for i, prefix in enumerate(COMPILE_BATCHES):
        graph = dict(cuda_graph=True, graph_bs=len(prefix) + 1) if cuda_graph else {}
        inp = build_target_verify(prefix, 4, heads=2, seed=i, **graph)
        args = [inp.q, inp.k_buffer, inp.v_buffer if with_v_buffer else None, inp.qo_indptr, inp.kv_indptr,
                inp.kv_indices, inp.custom_mask, inp.mask_indptr, inp.out_cache_loc]
        for t in args:
            if t is not None:
                torch._dynamo.mark_dynamic(t, 0)
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            o = compiled(*args)
        check_against_brute_force(inp, o / 2)
    assert counter.frame_count == 1


def test_adapter_explain_has_no_graph_break():
    inp = build_target_verify([37, 5, 120], 4, heads=2)
    args = (inp.q, inp.k_buffer, inp.v_buffer, inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.custom_mask,
            inp.mask_indptr, inp.out_cache_loc)
    explanation = torch._dynamo.explain(_compiled_step)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
