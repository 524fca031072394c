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


def flashmla_backend_inputs(pb, num_draft):
    """pb (a paged batch of n drafts per request, page 64) as SGLang's FlashMLA backend holds it:
    q [bs * n, H * 576], the layer's key buffer as a token pool [S, 1, 576], the block table and
    cache_seqlens, and the EAGLE verify input's FULL mask (row stride prefix + n)."""
    heads = pb.q.shape[1]
    return dict(q=pb.q.reshape(-1, heads * 576), k_buffer=pb.kv_cache.reshape(-1, 1, 576), block_table=pb.block_table,
                cache_seqlens=pb.cache_seqlens, custom_mask=pb.tree_mask, sm_scale=pb.sm_scale, num_draft_tokens=num_draft)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", ["same", "uint8"])
def test_flashmla_backend_layout(device, kv_dtype):
    from ddtree_op import mla_tree_verify_paged
    from ddtree_op.sglang import target_verify_forward_paged
    from ddtree_op.synthetic_paged import make_paged_batch

    n = 8
    pb = make_paged_batch([130, 5, 64], [n] * 3, 2, page_size=64, device=device, kv_dtype=kv_dtype,
                          kv_scale_tensor=kv_dtype != "same", seed=7)
    inputs = flashmla_backend_inputs(pb, n)
    o = target_verify_forward_paged(**inputs, k_scale=pb.kv_scale)
    want, _ = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs())
    assert o.shape == (3 * n, 2 * 512) and not torch.isnan(o).any()
    assert relative_error(o.view(-1, 2, 512), want) < 1e-6
    # the mask starts given as SGLang's Triton backend computes them: the same result
    given = target_verify_forward_paged(**inputs, k_scale=pb.kv_scale, mask_indptr=pb.mask_indptr)
    assert torch.equal(given, o)


def test_flashmla_backend_layout_names_its_arguments():
    from ddtree_op.sglang import target_verify_forward_paged
    from ddtree_op.synthetic_paged import make_paged_batch

    pb = make_paged_batch([70], [4], 2, page_size=64, seed=8)
    inputs = flashmla_backend_inputs(pb, 4)
    with pytest.raises(ValueError, match="'num_draft_tokens'"):
        target_verify_forward_paged(**dict(inputs, num_draft_tokens=3))
    with pytest.raises(ValueError, match="'k_buffer' must hold whole pages"):
        target_verify_forward_paged(**dict(inputs, k_buffer=inputs["k_buffer"][:-1]))
    with pytest.raises(ValueError, match="'custom_mask'"):
        target_verify_forward_paged(**dict(inputs, custom_mask=inputs["custom_mask"].float()))
    with pytest.raises(ValueError, match="'k_scale'"):
        target_verify_forward_paged(**inputs, k_scale=0.5)  # a bf16 cache takes no scale


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_key_buffer_with_its_scale(device):
    from ddtree_op import mla_tree_verify
    from ddtree_op.synthetic_paged import fp8_cache

    inp = build_target_verify([37, 5, 120], 4, heads=2, device=device, seed=9)
    scale = torch.tensor([0.03], device=device)
    fp8 = fp8_cache(inp.k_buffer.float().cpu(), 0.03, "uint8").to(device)  # SGLang keeps the bytes
    inp.k_buffer, inp.v_buffer = fp8, None
    o = run_adapter(inp, k_scale=scale)
    want, _ = mla_tree_verify(inp.q.view(inp.q.shape[0], 2, 576), fp8, qo_indptr=inp.qo_indptr, kv_indptr=inp.kv_indptr,
                              kv_indices=inp.kv_indices, out_cache_loc=inp.out_cache_loc, tree_mask=inp.custom_mask,
                              mask_indptr=inp.mask_indptr, sm_scale=inp.sm_scale, kv_scale=scale)
    assert torch.equal(o.view(-1, 2, 512), want) and not torch.isnan(want).any()


def test_flashmla_backend_layout_compiles_fullgraph():
    from ddtree_op.sglang import target_verify_forward_paged
    from ddtree_op.synthetic_paged import make_paged_batch

    def step(q, k_buffer, block_table, cache_seqlens, custom_mask):
        return target_verify_forward_paged(q, k_buffer, block_table=block_table, cache_seqlens=cache_seqlens,
                                           custom_mask=custom_mask, sm_scale=DEEPSEEK_V3_SM_SCALE, num_draft_tokens=4) * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for seed in (1, 2):
        pb = make_paged_batch([70, 3], [4, 4], 2, page_size=64, seed=seed)
        inputs = flashmla_backend_inputs(pb, 4)
        args = (inputs["q"], inputs["k_buffer"], inputs["block_table"], inputs["cache_seqlens"], inputs["custom_mask"])
        assert torch.equal(compiled(*args), step(*args))
