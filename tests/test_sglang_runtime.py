"""ddtree_op.integrations.sglang inside SGLang's own code (sglang 0.5.23, CPU, Triton interpreter).

SGLang builds everything the op consumes: its pools and allocator, EAGLE trees from its top-k
selection and tree-build code, TARGET_VERIFY metadata from its Triton backend (eager, and the
CUDA-graph capture/replay path with padded batches), and the dispatch from `RadixAttention`.
Skipped, with the reason, where sglang is not installed.
"""

import re
from pathlib import Path

import pytest
import torch

from sglang_runtime import sglang_skip_reason

_REASON = sglang_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

if _REASON is None:
    import sglang_runtime as sr
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from ddtree_op.integrations import sglang as ddtree_sglang
    from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE

HEADS = 4
# (topk, steps, draft tokens): SGLang's EAGLE settings, 4 to 64 draft tokens
TREES = [(1, 3, 4), (4, 3, 8), (4, 5, 16), (8, 4, 32), (8, 8, 64)]
PREFIXES = [37, 5, 120]  # ragged


def run_layer(backend, step, layer_id=0):
    layer = sr.radix_attention(HEADS, layer_id)
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=step.forward_batch):
        return layer(step.q, step.k, step.v, step.forward_batch)


def rel_err(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def real_rows(o, step):
    return o.view(-1, HEADS, 512)[: step.real_bs * step.num_draft]


def assert_eager_metadata(meta, step):
    """What the op relies on in SGLang's eager TARGET_VERIFY metadata."""
    bs, n = step.real_bs, step.num_draft
    assert meta.qo_indptr.dtype == torch.int32 and meta.qo_indptr.shape == (bs + 1,)
    assert torch.equal(meta.qo_indptr, torch.arange(0, (bs + 1) * n, n, dtype=torch.int32))
    assert meta.kv_indptr.dtype == torch.int32 and meta.kv_indptr.shape == (bs + 1,)
    assert meta.kv_indptr[-1] == sum(s.numel() for s in step.prefix_slots)  # prefix only
    assert meta.kv_indices.dtype == torch.int64 and meta.kv_indices.numel() >= int(meta.kv_indptr[-1])
    assert meta.custom_mask.dtype == torch.bool and meta.custom_mask.dim() == 1
    assert meta.mask_indptr.dtype == torch.int64 and meta.mask_indptr.shape == (bs + 1,)
    assert int(meta.mask_indptr[-1]) == meta.custom_mask.numel()  # FULL: n * (prefix + n) per request
    assert meta.max_extend_len == n and isinstance(meta.max_extend_len, int)
    assert step.forward_batch.out_cache_loc.dtype == torch.int64


# every tree in bf16, all but the 64-token one again in fp16 (it costs ~25 s in the interpreter)
@pytest.mark.parametrize("topk,steps,num_draft,dtype", [t + (torch.bfloat16,) for t in TREES]
                         + [t + (torch.float16,) for t in TREES[:-1]])
def test_eager_target_verify_matches_reference(topk, steps, num_draft, dtype):
    with sr.spec_config(topk, steps, num_draft):
        rt = sr.make_runtime(num_draft, heads=HEADS, dtype=dtype)
        backend = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        step = sr.verify_step(rt, PREFIXES, topk, steps, num_draft, seed=num_draft)
        backend.init_forward_metadata(step.forward_batch)
        assert_eager_metadata(backend.forward_metadata, step)
        o = run_layer(backend, step)
        # the drafts' rows went into the pool through its own set_kv_buffer
        assert torch.equal(rt.kv_pool.get_key_buffer(0)[step.forward_batch.out_cache_loc], step.k)
        assert o.shape == (step.q.shape[0], HEADS * 512) and o.dtype == dtype
        assert rel_err(real_rows(o, step), sr.reference_verify(rt, step, 0, DEEPSEEK_V3_SM_SCALE)) < 1e-2


def test_one_preparation_per_forward(monkeypatch):
    """The first layer of a forward prepares the step, the later layers attend over it; a new
    forward (layer ids start again) prepares again. Every layer matches the reference."""
    calls = []
    prepare = ddtree_sglang.prepare_target_verify
    monkeypatch.setattr(ddtree_sglang, "prepare_target_verify", lambda *a, **k: calls.append(1) or prepare(*a, **k))
    topk, steps, num_draft = 4, 3, 8
    with sr.spec_config(topk, steps, num_draft):
        rt = sr.make_runtime(num_draft, heads=HEADS, dtype=torch.float16)
        backend = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        step = sr.verify_step(rt, PREFIXES, topk, steps, num_draft, seed=3, layer_ids=range(sr.LAYERS))
        backend.init_forward_metadata(step.forward_batch)
        for forward in (1, 2):
            for layer_id in range(sr.LAYERS):
                o = run_layer(backend, step, layer_id)
                want = sr.reference_verify(rt, step, layer_id, DEEPSEEK_V3_SM_SCALE)
                assert rel_err(real_rows(o, step), want) < 2e-3
            assert len(calls) == forward


def test_compiled_forwards_reuse_one_graph():
    """Two forwards over new batches through the compiled layers: the preparation kept on each
    forward batch adds no guard that fails on the next one (one graph, no recompilation)."""
    from torch._dynamo.utils import counters

    topk, steps, num_draft = 4, 3, 8
    with sr.spec_config(topk, steps, num_draft):
        rt = sr.make_runtime(num_draft, heads=HEADS, dtype=torch.float16)
        backend = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        layers = [sr.radix_attention(HEADS, i) for i in range(sr.LAYERS)]

        def forward(q, k, v, forward_batch):
            return sum(layer(q, k, v, forward_batch) for layer in layers)

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
        for seed in (5, 6):
            step = sr.verify_step(rt, PREFIXES, topk, steps, num_draft, seed=seed, layer_ids=range(sr.LAYERS))
            backend.init_forward_metadata(step.forward_batch)
            with forward_context(ForwardContext(attn_backend=backend), forward_batch=step.forward_batch):
                got = compiled(step.q, step.k, step.v, step.forward_batch)
            want = sum(sr.reference_verify(rt, step, i, DEEPSEEK_V3_SM_SCALE) for i in range(sr.LAYERS))
            assert rel_err(real_rows(got, step), want) < 2e-3
        assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("topk,steps,num_draft", [(1, 3, 4), (4, 3, 8)])
def test_matches_sglang_triton_extend_kernel_fp16(topk, steps, num_draft):
    # fp16 only: the Triton interpreter computes tl.dot wrongly in bf16 (an interpreter limitation).
    with sr.spec_config(topk, steps, num_draft):
        rt = sr.make_runtime(num_draft, heads=HEADS, dtype=torch.float16)
        step = sr.verify_step(rt, PREFIXES, topk, steps, num_draft, seed=topk)
        ours = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        ours.init_forward_metadata(step.forward_batch)
        o_ours = run_layer(ours, step)
        theirs = TritonAttnBackend(rt.runner)
        theirs.init_forward_metadata(step.forward_batch)
        o_theirs = run_layer(theirs, step)
        ref = sr.reference_verify(rt, step, 0, DEEPSEEK_V3_SM_SCALE)
        assert rel_err(real_rows(o_theirs, step), ref) < 2e-3  # SGLang's kernel agrees with the reference...
        assert rel_err(real_rows(o_ours, step), real_rows(o_theirs, step).double()) < 2e-3  # ...and with the op


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cuda_graph_capture_then_replay_padded_batches(dtype):
    """SGLang's CUDA-graph metadata path: state for the largest batch, capture at bs 4 with dummy
    requests, then replays of batches of 3 and 2 real requests (new trees, padded to 4)."""
    topk, steps, n, graph_bs = 4, 3, 8, 4
    with sr.spec_config(topk, steps, n):
        rt = sr.make_runtime(n, heads=HEADS, dtype=dtype)
        backend = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        backend.init_cuda_graph_state(max_bs=graph_bs, max_num_tokens=graph_bs * n)
        capture = sr.verify_step(rt, [1] * graph_bs, topk, steps, n, seed=0)
        backend.init_forward_metadata_out_graph(capture.forward_batch, in_capture=True)
        captured = backend.forward_metadata
        assert captured.qo_indptr.dtype == torch.int64 and captured.custom_mask.dtype == torch.uint8
        assert captured.kv_indices.numel() == graph_bs * n * rt.runner.model_config.context_len
        run_layer(backend, capture)
        for seed, prefixes in [(1, [64, 9, 30]), (2, [3, 100])]:
            step = sr.verify_step(rt, prefixes, topk, steps, n, seed=seed, pad_to=graph_bs)
            backend.init_forward_metadata_out_graph(step.forward_batch, in_capture=False)
            meta = backend.forward_metadata
            assert meta is captured  # replay refills the captured buffers in place
            assert meta.custom_mask.numel() > int(meta.mask_indptr[-1])  # preallocated for the largest context
            o = run_layer(backend, step)
            assert not torch.isnan(real_rows(o, step)).any()
            assert rel_err(real_rows(o, step), sr.reference_verify(rt, step, 0, DEEPSEEK_V3_SM_SCALE)) < 1e-2


def test_other_modes_and_layers_are_sglangs(monkeypatch):
    calls = []
    monkeypatch.setattr(TritonAttnBackend, "forward_extend", lambda self, *a, **k: calls.append(a[4].forward_mode) or "sglang")
    with sr.spec_config(4, 3, 8):
        rt = sr.make_runtime(8, heads=HEADS)
        backend = ddtree_sglang.DDTreeTritonAttnBackend(rt.runner)
        step = sr.verify_step(rt, [20, 7], 4, 3, 8, seed=5)
        backend.init_forward_metadata(step.forward_batch)
        layer = sr.radix_attention(HEADS)
        capped = sr.radix_attention(HEADS)
        capped.logit_cap = 30.0
        assert backend.forward_extend(step.q, step.k, step.v, capped, step.forward_batch) == "sglang"
        assert backend.forward_extend(step.q, step.k, step.v, layer, step.forward_batch, sinks=torch.zeros(HEADS)) == "sglang"
        step.forward_batch.forward_mode = ForwardMode.EXTEND
        assert backend.forward_extend(step.q, step.k, step.v, layer, step.forward_batch) == "sglang"
        step.forward_batch.forward_mode = ForwardMode.TARGET_VERIFY
        assert backend.forward_extend(step.q, step.k, step.v, layer, step.forward_batch) != "sglang"
    assert len(calls) == 3


def _readme_recipe() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## SGLang integration", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README's SGLang section has no python block"
    return blocks[0]


def test_readme_recipe_registers_the_backend():
    from sglang.srt.arg_groups import choices

    try:
        exec(compile(_readme_recipe(), "README.md", "exec"), {})
        assert "ddtree" in choices.ATTENTION_BACKEND_CHOICES
        with sr.spec_config(4, 3, 8, backend="ddtree"):  # the flag: --attention-backend ddtree
            rt = sr.make_runtime(8, heads=HEADS)
            backend = attention_registry.ATTENTION_BACKENDS["ddtree"](rt.runner)
            assert type(backend) is ddtree_sglang.DDTreeTritonAttnBackend
            assert type(attention_registry.ATTENTION_BACKENDS["triton"](rt.runner)) is TritonAttnBackend
            ddtree_sglang.install(replace_triton=True)
            assert type(attention_registry.ATTENTION_BACKENDS["triton"](rt.runner)) is ddtree_sglang.DDTreeTritonAttnBackend
    finally:
        ddtree_sglang.uninstall()
    assert "ddtree" not in attention_registry.ATTENTION_BACKENDS
    assert attention_registry.ATTENTION_BACKENDS["triton"] is attention_registry.create_triton_backend


def test_gpu_fixture_is_what_sglang_produces():
    """tests/data/sglang_verify_metadata.pt (read by the GPU test, where sglang is absent) is this
    SGLang's metadata; regenerate with `python tests/sglang_runtime.py` after an upgrade."""
    saved, now = torch.load(sr.FIXTURE, weights_only=False), sr.build_fixture()
    assert saved["sglang"] == now["sglang"] and saved["case"] == now["case"] and saved["pool_rows"] == now["pool_rows"]
    for a, b in zip(saved["eager"] + [saved["capture"]] + saved["replays"], now["eager"] + [now["capture"]] + now["replays"]):
        assert a.keys() == b.keys()
        for key in a:
            if torch.is_tensor(a[key]):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_bench_sglang_triton_extend_matches_reference_fp16():
    from bench.sglang_triton_extend import available, make_sglang_triton_extend
    from conftest import brute_force_verify
    from ddtree_op.synthetic import make_verify_batch

    assert available() == (True, sr.SGLANG_VERSION)
    vb = make_verify_batch([37, 5, 60], [8, 8, 8], 2, dtype=torch.float16, seed=3)
    out = torch.full((vb.q.shape[0], 2, 512), float("nan"), dtype=torch.float16)
    make_sglang_triton_extend(vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                              vb.mask_indptr, vb.sm_scale, 8, out)()
    want, _ = brute_force_verify(vb)
    assert rel_err(out, want) < 2e-3
