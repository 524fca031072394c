"""On a GPU: the SGLang adapter and DDTreeTritonAttnBackend.forward_extend on CUDA tensors built
from metadata that SGLang 0.5.23 produced on a CPU (tests/data/sglang_verify_metadata.pt, written
by `python tests/sglang_runtime.py`): eager batches, then a CUDA graph captured on SGLang's
capture-time buffers and replayed with new trees and prefixes written into the same buffers.

The GPU machine need not have sglang: where it does not import, the three SGLang names the
integration module imports are stand-ins (the backend's own forward_extend code is what runs).
The KV values and queries are random; only the metadata comes from SGLang.
"""

import dataclasses
import enum
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import needs_cuda
from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE

FIXTURE = Path(__file__).resolve().parent / "data" / "sglang_verify_metadata.pt"
pytestmark = needs_cuda
# "auto" is the sm90 kernel on an H200 (with the CUTLASS headers), the Triton kernel elsewhere.
BACKENDS = ["auto", "triton"]


def load_fixture():
    return torch.load(FIXTURE, weights_only=False)


def reference(q, pool, rec, n, heads):
    """float64 attention of the real requests, from the record's prefix slots, drafts and FULL mask."""
    q, pool = q.double().cpu().view(-1, heads, 576), pool.double().cpu()[:, 0]
    kv_indptr, kv_indices, mask_indptr = rec["kv_indptr"].cpu(), rec["kv_indices"].cpu(), rec["mask_indptr"].cpu()
    out_cache_loc, mask = rec["out_cache_loc"].cpu(), rec["custom_mask"].cpu().bool()
    out = torch.zeros(rec["real_bs"] * n, heads, 512, dtype=torch.float64)
    for b in range(rec["real_bs"]):
        keys = torch.cat([kv_indices[kv_indptr[b] : kv_indptr[b + 1]], out_cache_loc[b * n : (b + 1) * n]])
        vis = mask[mask_indptr[b] : mask_indptr[b + 1]].view(n, keys.numel())
        kv = pool[keys]
        rows = slice(b * n, (b + 1) * n)
        s = torch.einsum("thd,kd->htk", q[rows], kv) * DEEPSEEK_V3_SM_SCALE
        out[rows] = torch.einsum("htk,kd->thd", torch.softmax(s.masked_fill(~vis, float("-inf")), -1), kv[:, :512])
    return out


def rel_err(got, want):
    return float((got.double().cpu() - want).norm() / want.norm())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_adapter_on_sglang_eager_metadata(dtype, backend):
    from ddtree_op.sglang import target_verify_forward

    data = load_fixture()
    case = data["case"]
    n, heads = case["num_draft"], case["heads"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rec in data["eager"]:
        m = {k: v.cuda() if torch.is_tensor(v) else v for k, v in rec.items()}
        pool = torch.randn(data["pool_rows"], 1, 576, device="cuda", generator=gen).to(dtype)
        tokens = m["qo_indptr"][-1].item()
        q = torch.randn(tokens, heads * 576, device="cuda", generator=gen).to(dtype)
        pool[m["out_cache_loc"]] = torch.randn(tokens, 1, 576, device="cuda", generator=gen).to(dtype)
        o = target_verify_forward(
            q, pool, v_buffer=pool[..., :512], qo_indptr=m["qo_indptr"], kv_indptr=m["kv_indptr"], kv_indices=m["kv_indices"],
            custom_mask=m["custom_mask"], mask_indptr=m["mask_indptr"], out_cache_loc=m["out_cache_loc"],
            sm_scale=DEEPSEEK_V3_SM_SCALE, num_draft_tokens=m["max_extend_len"], backend=backend,
        )
        torch.cuda.synchronize()
        assert rel_err(o.view(-1, heads, 512), reference(q, pool, rec, n, heads)) < 1e-2


@pytest.fixture
def integration():
    """ddtree_op.integrations.sglang, with stand-ins for the SGLang names it imports where sglang is
    absent; the stand-ins (and the module imported over them) are gone again after the test."""
    if "sglang" in sys.modules or importlib.util.find_spec("sglang") is not None:
        from ddtree_op.integrations import sglang as integration

        yield integration
        return

    class TritonAttnBackend:  # the one parent method the subclass calls on this path
        def _set_kv_buffer(self, forward_batch, layer, loc_info, k, v):
            self.token_to_kv_pool.set_kv_buffer(layer, loc_info, k, v)

    @dataclasses.dataclass
    class KVWriteLoc:
        loc: torch.Tensor
        swa_loc: object = None
        full_loc: object = None
        physical: bool = False

        @classmethod
        def for_batch(cls, forward_batch, *, swa_loc=None, full_loc=None):
            return cls(forward_batch.out_cache_loc, swa_loc, full_loc, forward_batch.out_cache_loc_is_physical)

    names = {
        "sglang.srt.configs.model_config": dict(AttentionArch=enum.Enum("AttentionArch", "MLA MHA")),
        "sglang.srt.layers.attention.attention_registry": dict(ATTENTION_BACKENDS={}),
        "sglang.srt.layers.attention.triton_backend": dict(TritonAttnBackend=TritonAttnBackend),
        "sglang.srt.mem_cache.memory_pool": dict(KVWriteLoc=KVWriteLoc),
    }
    packages = ["sglang", "sglang.srt", "sglang.srt.configs", "sglang.srt.layers", "sglang.srt.layers.attention",
                "sglang.srt.mem_cache"]
    added = packages + list(names) + ["ddtree_op.integrations.sglang"]
    for package in packages:
        sys.modules[package] = types.ModuleType(package)
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    sys.modules["sglang.srt.layers.attention"].attention_registry = sys.modules[
        "sglang.srt.layers.attention.attention_registry"]
    try:
        from ddtree_op.integrations import sglang as integration

        yield integration
    finally:  # a later test's find_spec("sglang") must not find the stand-ins
        for name in added:
            sys.modules.pop(name, None)
        import ddtree_op.integrations

        ddtree_op.integrations.__dict__.pop("sglang", None)


class MLAPool:
    """The MLATokenToKVPool calls the backend makes: one [rows, 1, 576] buffer per layer, V its first 512 columns."""

    def __init__(self, rows, dtype):
        self.buffer = torch.zeros(rows, 1, 576, dtype=dtype, device="cuda")

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v):
        self.buffer[loc_info.loc] = cache_k.to(self.buffer.dtype)

    def get_key_buffer(self, layer_id):
        return self.buffer

    def get_value_buffer(self, layer_id):
        return self.buffer[..., :512]


@pytest.mark.parametrize("op_backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_backend_forward_captured_and_replayed_with_new_trees(dtype, op_backend, integration):
    data = load_fixture()
    case = data["case"]
    n, heads, graph_bs = case["num_draft"], case["heads"], case["graph_bs"]
    cap = data["capture"]
    # SGLang's CUDA-graph buffers, allocated once at their capture sizes.
    static = dict(
        qo_indptr=torch.zeros_like(cap["qo_indptr"], device="cuda"), kv_indptr=torch.zeros_like(cap["kv_indptr"], device="cuda"),
        kv_indices=torch.zeros(cap["kv_indices_numel"], dtype=torch.int64, device="cuda"),
        custom_mask=torch.zeros_like(cap["custom_mask"], device="cuda"), mask_indptr=torch.zeros_like(cap["mask_indptr"], device="cuda"),
        out_cache_loc=torch.zeros_like(cap["out_cache_loc"], device="cuda"),
    )
    tokens = graph_bs * n
    q = torch.zeros(tokens, heads * 576 + 64, dtype=dtype, device="cuda")[:, : heads * 576]  # a view, as SGLang's
    k = torch.zeros(tokens, 1, 576, dtype=dtype, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)

    def load(rec):
        for name in ("qo_indptr", "kv_indptr", "custom_mask", "mask_indptr", "out_cache_loc"):
            static[name].copy_(rec[name])
        static["kv_indices"][: rec["kv_indices"].numel()].copy_(rec["kv_indices"])
        q.copy_(torch.randn(q.shape, device="cuda", generator=gen).to(dtype))
        k.copy_(torch.randn(k.shape, device="cuda", generator=gen).to(dtype))

    backend = object.__new__(integration.DDTreeTritonAttnBackend)
    backend.__dict__.update(use_mla=True, dcp_size=1, enable_deterministic=False, dllm_attention=None,
                            token_to_kv_pool=MLAPool(data["pool_rows"], dtype), ddtree_backend=op_backend)
    backend.token_to_kv_pool.buffer.copy_(torch.randn(backend.token_to_kv_pool.buffer.shape, device="cuda", generator=gen).to(dtype))
    backend.forward_metadata = types.SimpleNamespace(
        qo_indptr=static["qo_indptr"], kv_indptr=static["kv_indptr"], kv_indices=static["kv_indices"],
        custom_mask=static["custom_mask"], mask_indptr=static["mask_indptr"], max_extend_len=cap["max_extend_len"],
        swa_out_cache_loc=None,
    )
    layer = types.SimpleNamespace(qk_head_dim=576, v_head_dim=512, tp_q_head_num=heads, layer_id=0, scaling=DEEPSEEK_V3_SM_SCALE,
                                  k_scale=None, logit_cap=0.0, is_cross_attention=False, sliding_window_size=-1)
    forward_batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_target_verify=lambda: True),
                                          out_cache_loc=static["out_cache_loc"], out_cache_loc_is_physical=False)

    def step():
        return backend.forward_extend(q, k, k[..., :512], layer, forward_batch)

    load(cap)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = step()
    for rec in data["replays"]:
        load(rec)
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        pool = backend.token_to_kv_pool.buffer
        assert torch.equal(pool[static["out_cache_loc"][: rec["real_bs"] * n]], k[: rec["real_bs"] * n])  # drafts written
        got = o.view(-1, heads, 512)[: rec["real_bs"] * n]
        assert not torch.isnan(got).any()
        assert rel_err(got, reference(q, pool, rec, n, heads)) < 1e-2
