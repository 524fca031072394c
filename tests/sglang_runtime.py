"""SGLang's own objects on a CPU machine, for the tests of ddtree_op.integrations.sglang.

Builds, with sglang's code (a pinned release, see tests/requirements-sglang.txt): a tiny
DeepSeek-V3 `ModelConfig`, `ReqToTokenPool`, `MLATokenToKVPool` and its allocator, the runner's
`KVIndexTranslator`, the Triton attention backend (or the ddtree subclass), EAGLE draft trees from
SGLang's top-k selection and tree-build code, a TARGET_VERIFY `ForwardBatch` with its KV plan,
and a `RadixAttention` layer. The model runner itself (which loads weights and starts process
groups) is a namespace with the attributes the backend reads.

CPU switches, all in `setup_cpu()`: SGLang's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, set before sglang's kernel modules are imported, since @triton.jit reads it); SGLang's Triton ports of the tree build are
chosen by an `_is_xpu` flag of their module; torchvision's wheels need a CUDA torch of the same
release, so an inert stand-in is importable when no torchvision is installed (SGLang imports it
for multimodal models only); the parallel ranks are stated once as a single-GPU process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import types
from dataclasses import dataclass

import torch

SGLANG_VERSION = "0.5.23"
LAYERS = 2


class _InertType(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertType(name, (), {"__init__": lambda self, *a, **k: None})


class _InertTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__version__ = "0.0"
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


_SETUP = {}


def sglang_skip_reason() -> str | None:
    """Why the SGLang tests cannot run here, or None."""
    try:
        found = importlib.util.find_spec("sglang") is not None
    except ValueError:  # a stand-in module without a spec (tests/test_sglang_gpu.py on a GPU machine)
        found = False
    if not found:
        return "sglang is not installed (CI: pip install --no-deps sglang==%s -r tests/requirements-sglang.txt)" % SGLANG_VERSION
    if not _SETUP.get("done") and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton's own @triton.jit helpers (tl.cdiv...) are compiled-mode objects once triton is
        # imported without the interpreter, and SGLang's kernels then fail inside it.
        return ("triton was imported before TRITON_INTERPRET=1 could be set: run the SGLang tests in their own process, "
                "python -m pytest tests/test_sglang_runtime.py tests/test_sglang_model.py (CI does)")
    try:
        setup_cpu()
    except Exception as exc:  # an import failure names the missing dependency
        return f"sglang does not import here: {type(exc).__name__}: {exc}"
    return None


def setup_cpu() -> None:
    """Imports sglang with the CPU switches above and publishes a single-process configuration."""
    if _SETUP.get("done"):
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _InertTorchvision())
    import sglang

    assert sglang.__version__ == SGLANG_VERSION, f"tests are pinned to sglang {SGLANG_VERSION}, got {sglang.__version__}"
    from sglang.kernels.ops.speculative import spec_tree
    from sglang.srt.runtime_context import get_parallel

    if not torch.cuda.is_available():
        spec_tree._is_xpu = True  # SGLang's Triton port of the tree build (the CUDA one is a C++ kernel)
    get_parallel().override_permanently(attn_dcp_rank=0, attn_tp_rank=0, attn_cp_rank=0, tp_rank=0, pp_rank=0,
                                        moe_ep_rank=0, moe_tp_rank=0, attn_dp_rank=0)
    _SETUP["done"] = True


def spec_config(topk: int, steps: int, num_draft: int, backend: str = "triton"):
    """SGLang's server args for EAGLE with these settings (a context manager)."""
    from sglang.srt.runtime_context import get_context

    return get_context().override_server_args(
        speculative_algorithm="EAGLE", speculative_eagle_topk=topk, speculative_num_steps=steps,
        speculative_num_draft_tokens=num_draft, attention_backend=backend, device="cpu",
    )


def tiny_deepseek_v3_config(heads: int = 4, layers: int = LAYERS):
    """The HF config of a DeepSeek-V3 with its MLA geometry (kv_lora_rank 512, rope 64), all else tiny."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=layers,
        first_k_dense_replace=layers, num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=48,
        kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, max_position_embeddings=512,
        architectures=["DeepseekV3ForCausalLM"],
    )


def model_config(heads: int = 4, context_len: int = 512, dtype: str = "bfloat16"):
    from sglang.srt.configs.model_config import ModelConfig

    path = tempfile.mkdtemp(prefix="ddtree-sglang-dsv3-")
    tiny_deepseek_v3_config(heads).save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["model_type"] == "deepseek_v3"
    return ModelConfig(path, context_length=context_len, dtype=dtype)


@dataclass
class Runtime:
    runner: types.SimpleNamespace
    req_to_token_pool: object
    kv_pool: object
    allocator: object
    translator: object
    heads: int
    dtype: torch.dtype


def make_runtime(num_draft: int, *, heads: int = 4, dtype=torch.bfloat16, max_reqs: int = 16, pool_tokens: int = 8192,
                 context_len: int = 512) -> Runtime:
    """SGLang's pools, allocator and translator, and a model-runner namespace (call inside spec_config)."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool

    mc = model_config(heads, context_len, "bfloat16" if dtype == torch.bfloat16 else "float16")
    req_pool = ReqToTokenPool(size=max_reqs, max_context_len=context_len, device="cpu", enable_memory_saver=False)
    kv_pool = MLATokenToKVPool(size=pool_tokens, page_size=1, dtype=dtype, kv_lora_rank=512, qk_rope_head_dim=64,
                               layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=pool_tokens, dtype=dtype, device="cpu", kvcache=kv_pool, need_sort=False)
    translator = KVIndexTranslator(req_to_token=req_pool.req_to_token, token_to_kv_pool_allocator=allocator,
                                   token_to_kv_pool=kv_pool, page_size=1, device="cpu")
    runner = types.SimpleNamespace(
        model_config=mc, req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, token_to_kv_pool_allocator=allocator,
        kv_index_translator=translator, sliding_window_size=None, page_size=1, device="cpu", gpu_id=0,
        is_draft_worker=False, kv_cache_dtype=dtype, use_mla_backend=True,
        decode_num_tokens_per_req=lambda: num_draft, spec_algorithm=types.SimpleNamespace(is_dspark=lambda: False),
    )
    return Runtime(runner, req_pool, kv_pool, allocator, translator, heads, dtype)


def radix_attention(heads: int, layer_id: int = 0):
    """The absorbed MLA attention layer of DeepSeek-V3 as SGLang builds it (576-wide keys, one KV head)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE

    return RadixAttention(heads, 576, DEEPSEEK_V3_SM_SCALE, num_kv_heads=1, layer_id=layer_id, v_head_dim=512)


def eagle_tree(bs: int, topk: int, steps: int, num_draft: int, seq_lens: torch.Tensor, gen: torch.Generator,
               vocab: int = 96):
    """A draft tree per request from SGLang's own EAGLE code: `select_top_k_tokens` on random draft
    probabilities each step, `organize_draft_results`, then `build_tree_kernel_efficient` (FULL mask)."""
    from sglang.srt.speculative import spec_utils
    from sglang.srt.speculative.eagle_utils import build_tree_kernel_efficient, organize_draft_results

    # The later-step selection is torch.compile'd in SGLang; its eager function is the same code.
    later = getattr(spec_utils._select_top_k_tokens_later, "_torchdynamo_orig_callable", None)
    score_list, token_list, parents_list = [], [], []
    hidden = torch.zeros(bs, 8)
    probs = torch.softmax(torch.randn(bs, vocab, generator=gen) * 3, -1)
    topk_p, topk_index = torch.topk(probs, topk, dim=-1)
    scores = None
    for i in range(steps):
        if i == 0 or later is None:
            _, hidden, scores, tree_info = spec_utils.select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        else:
            _, hidden, scores, tree_info = later(i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        probs = torch.softmax(torch.randn(hidden.shape[0], vocab, generator=gen) * 3, -1)
        topk_p, topk_index = torch.topk(probs, topk, dim=-1)
    parent_list, top_scores_index, draft_tokens = organize_draft_results(score_list, token_list, parents_list, num_draft)
    bonus = torch.randint(0, vocab, (bs,), generator=gen)
    tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens = build_tree_kernel_efficient(
        bonus, parent_list, top_scores_index, draft_tokens, seq_lens, int(seq_lens.sum()), topk, steps, num_draft,
    )
    return types.SimpleNamespace(custom_mask=tree_mask, positions=positions, retrieve_index=retrieve_index,
                                 retrieve_next_token=retrieve_next_token, retrieve_next_sibling=retrieve_next_sibling,
                                 draft_tokens=tokens)


@dataclass
class VerifyStep:
    forward_batch: object
    q: torch.Tensor  # [T, H * 576]
    k: torch.Tensor  # [T, 1, 576] the drafts' latent rows
    v: torch.Tensor  # [T, 1, 512]
    tree: types.SimpleNamespace
    prefix_slots: list  # per request, the prefix's pool slots
    real_bs: int
    num_draft: int


def verify_step(rt: Runtime, prefix_lens, topk: int, steps: int, num_draft: int, *, seed: int = 0, pad_to: int | None = None,
                layer_ids=(0,), reuse_requests=None) -> VerifyStep:
    """A TARGET_VERIFY batch: requests with prefixes in the pool (random KV in the given layers),
    drafts allocated by SGLang's allocator, SGLang's tree, a ForwardBatch with its KV plan bound.
    `pad_to` pads the batch the way a CUDA-graph runner does (seq_len fill value, request 0,
    slot 0) for the capture/replay metadata path."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    if reuse_requests is None:
        req_ids = torch.tensor(rt.req_to_token_pool.alloc_rows(bs), dtype=torch.int64)
        prefix_slots = []
        for b, n in enumerate(prefix_lens):
            slots = rt.allocator.alloc(n).to(torch.int64)
            rt.req_to_token_pool.req_to_token[req_ids[b], :n] = slots.to(rt.req_to_token_pool.req_to_token.dtype)
            prefix_slots.append(slots)
            for layer in layer_ids:
                rt.kv_pool.kv_buffer[layer][slots] = torch.randn(n, 1, 576, generator=gen).to(rt.dtype)
    else:
        req_ids, prefix_slots = reuse_requests
    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
    tree = eagle_tree(bs, topk, steps, num_draft, seq_lens, gen)
    out_cache_loc = rt.allocator.alloc(bs * num_draft).to(torch.int64)
    tokens = bs * num_draft
    q = torch.randn(tokens, rt.heads * 576 + 64, generator=gen).to(rt.dtype)[:, : rt.heads * 576]  # a view, as SGLang's
    k = torch.randn(tokens, 1, 576, generator=gen).to(rt.dtype)
    v = k[..., :512]
    spec_info = EagleVerifyInput(
        draft_token=tree.draft_tokens, custom_mask=tree.custom_mask, positions=tree.positions,
        retrieve_index=tree.retrieve_index, retrieve_next_token=tree.retrieve_next_token,
        retrieve_next_sibling=tree.retrieve_next_sibling, retrieve_cum_len=None, spec_steps=steps, topk=topk,
        draft_token_num=num_draft, capture_hidden_mode=None, seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens,
    )
    run_bs = bs
    rpi, sl, ocl = req_ids, seq_lens, out_cache_loc
    if pad_to is not None and pad_to > bs:
        run_bs, pad = pad_to, pad_to - bs
        rpi = torch.cat([req_ids, torch.zeros(pad, dtype=torch.int64)])
        sl = torch.cat([seq_lens, torch.ones(pad, dtype=torch.int64)])
        ocl = torch.cat([out_cache_loc, torch.zeros(pad * num_draft, dtype=torch.int64)])
        q = torch.cat([q, torch.randn(pad * num_draft, q.shape[1], generator=gen).to(rt.dtype)])
        k = torch.cat([k, torch.randn(pad * num_draft, 1, 576, generator=gen).to(rt.dtype)])
        v = k[..., :512]
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=run_bs, input_ids=torch.zeros(run_bs * num_draft, dtype=torch.int64),
        req_pool_indices=rpi, seq_lens=sl, out_cache_loc=ocl, seq_lens_sum=int(sl.sum()), seq_lens_cpu=sl.clone(),
        positions=torch.cat([tree.positions, torch.zeros((run_bs - bs) * num_draft, dtype=torch.int64)]),
        spec_info=spec_info,
    )
    rt.translator.own_plan(fb).bind(fb, rt.translator)
    return VerifyStep(fb, q, k, v, tree, prefix_slots, bs, num_draft)


def reference_verify(rt: Runtime, step: VerifyStep, layer_id: int, sm_scale: float) -> torch.Tensor:
    """float64 attention from SGLang's FULL mask: request b's drafts see its prefix and the drafts
    its mask row allows; keys are read from the pool after the drafts' rows were written."""
    heads, n = rt.heads, step.num_draft
    pool = rt.kv_pool.get_key_buffer(layer_id).double()[:, 0]
    q = step.q.double().view(-1, heads, 576)
    mask = step.tree.custom_mask
    out = torch.zeros(step.real_bs * n, heads, 512, dtype=torch.float64)
    offset = 0
    for b in range(step.real_bs):
        prefix = step.prefix_slots[b]
        keys = torch.cat([prefix, step.forward_batch.out_cache_loc[b * n : (b + 1) * n]])
        width = prefix.numel() + n
        vis = mask[offset : offset + n * width].view(n, width).bool()
        offset += n * width
        kv = pool[keys]
        for h in range(heads):
            s = q[b * n : (b + 1) * n, h] @ kv.T * sm_scale
            s = s.masked_fill(~vis, float("-inf"))
            out[b * n : (b + 1) * n, h] = torch.softmax(s, -1) @ kv[:, :512]
    return out


# ---- The metadata fixture for the GPU test (tests/test_sglang_gpu.py runs where sglang is absent) ----

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sglang_verify_metadata.pt")
FIXTURE_CASE = dict(topk=4, steps=3, num_draft=8, heads=4, graph_bs=4, context_len=256, pool_tokens=2048)
FIXTURE_EAGER = [[37, 5, 120], [200, 1, 64, 17]]
FIXTURE_REPLAYS = [[64, 9, 30], [3, 100]]


def _meta_record(meta, step) -> dict:
    used = int(meta.kv_indptr[-1])
    return dict(
        qo_indptr=meta.qo_indptr.clone(), kv_indptr=meta.kv_indptr.clone(), kv_indices=meta.kv_indices[:used].clone(),
        kv_indices_numel=meta.kv_indices.numel(), custom_mask=meta.custom_mask.clone(), mask_indptr=meta.mask_indptr.clone(),
        max_extend_len=meta.max_extend_len, out_cache_loc=step.forward_batch.out_cache_loc.clone(), real_bs=step.real_bs,
        prefix_lens=[s.numel() for s in step.prefix_slots],
    )


def build_fixture() -> dict:
    """SGLang's TARGET_VERIFY metadata, eager and CUDA-graph (capture, then two padded replays)."""
    setup_cpu()
    from ddtree_op.integrations.sglang import DDTreeTritonAttnBackend

    c = FIXTURE_CASE
    out = dict(case=dict(c), sglang=SGLANG_VERSION, eager=[], replays=[])
    with spec_config(c["topk"], c["steps"], c["num_draft"]):
        rt = make_runtime(c["num_draft"], heads=c["heads"], pool_tokens=c["pool_tokens"], context_len=c["context_len"])
        out["pool_rows"] = rt.kv_pool.get_key_buffer(0).shape[0]
        backend = DDTreeTritonAttnBackend(rt.runner)
        for seed, prefixes in enumerate(FIXTURE_EAGER):
            step = verify_step(rt, prefixes, c["topk"], c["steps"], c["num_draft"], seed=10 + seed, layer_ids=())
            backend.init_forward_metadata(step.forward_batch)
            out["eager"].append(_meta_record(backend.forward_metadata, step))
        backend.init_cuda_graph_state(max_bs=c["graph_bs"], max_num_tokens=c["graph_bs"] * c["num_draft"])
        capture = verify_step(rt, [1] * c["graph_bs"], c["topk"], c["steps"], c["num_draft"], seed=20, layer_ids=())
        backend.init_forward_metadata_out_graph(capture.forward_batch, in_capture=True)
        out["capture"] = _meta_record(backend.forward_metadata, capture)
        for seed, prefixes in enumerate(FIXTURE_REPLAYS):
            step = verify_step(rt, prefixes, c["topk"], c["steps"], c["num_draft"], seed=30 + seed,
                               pad_to=c["graph_bs"], layer_ids=())
            backend.init_forward_metadata_out_graph(step.forward_batch, in_capture=False)
            out["replays"].append(_meta_record(backend.forward_metadata, step))
    return out


if __name__ == "__main__":  # python tests/sglang_runtime.py: rewrites the fixture
    data = build_fixture()
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    torch.save(data, FIXTURE)
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes)")
