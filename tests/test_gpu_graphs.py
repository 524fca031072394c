"""CUDA graphs, torch.compile and streams: captured steps replay with new lengths, slots and trees;
reduce-overhead compiles without graph breaks; two streams at once; repeated calls are bitwise
identical."""

import pytest
import torch

from conftest import needs_cuda, relative_error
from gpu_cases import assert_matches_reference, capture, cuda_backends
from ddtree_op import mla_tree_verify, ops
from ddtree_op.synthetic import make_verify_batch

pytestmark = needs_cuda


class StaticBuffers:
    """SGLang-style preallocated verify buffers that a captured graph reads; `load` writes a new
    batch into them (prefix of each buffer; the rest keeps stale values)."""

    def __init__(self, rows, heads, pool, max_prefix_tokens, max_mask, batch):
        cuda = dict(device="cuda")
        self.q = torch.randn(rows, heads, 576, **cuda).to(torch.bfloat16)
        self.kv_cache = torch.randn(pool, 576, **cuda).to(torch.bfloat16)
        self.qo_indptr = torch.zeros(batch + 1, dtype=torch.int64, **cuda)
        self.kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, **cuda)
        self.kv_indices = torch.zeros(max_prefix_tokens, dtype=torch.int64, **cuda)
        self.out_cache_loc = torch.zeros(rows, dtype=torch.int64, **cuda)
        self.tree_mask = torch.zeros(max_mask, dtype=torch.bool, **cuda)
        self.mask_indptr = torch.zeros(batch + 1, dtype=torch.int64, **cuda)

    def load(self, vb):
        self.q.normal_()
        for name in ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "tree_mask", "mask_indptr"):
            buf, value = getattr(self, name), getattr(vb, name)
            assert value.numel() <= buf.numel(), name
            buf.view(-1)[: value.numel()].copy_(value.reshape(-1))

    def kwargs(self, sm_scale):
        return dict(qo_indptr=self.qo_indptr, kv_indptr=self.kv_indptr, kv_indices=self.kv_indices,
                    out_cache_loc=self.out_cache_loc, tree_mask=self.tree_mask, mask_indptr=self.mask_indptr,
                    sm_scale=sm_scale)


def test_prep_ops_replay_in_cuda_graph():
    buf = StaticBuffers(rows=30, heads=1, pool=400, max_prefix_tokens=200, max_mask=2000, batch=3)
    buf.load(make_verify_batch([40, 9, 0], [5, 7, 3], 1, device="cuda"))

    def prep():
        vind, vidx = ops.build_verify_indices(buf.qo_indptr, buf.kv_indptr, buf.kv_indices, buf.out_cache_loc)
        words = ops.convert_tree_mask(buf.tree_mask, buf.mask_indptr, buf.qo_indptr, buf.kv_indptr, "full", 30, 1)
        fused = ops.prepare_verify(buf.qo_indptr, buf.kv_indptr, buf.kv_indices, buf.out_cache_loc, buf.tree_mask,
                                   buf.mask_indptr, "full", 30, 1)
        return (vind, vidx, words) + tuple(fused)

    graph, captured = capture(prep)
    for seed, (prefix, drafts) in enumerate([([3, 30, 12], [8, 2, 5]), ([0, 0, 44], [1, 1, 13]), ([51, 1, 1], [6, 6, 3])]):
        buf.load(make_verify_batch(prefix, drafts, 1, device="cuda", seed=seed + 1))
        for t in captured:
            t.fill_(-7)  # poison: replay must rewrite them
        graph.replay()
        cpu = [t.cpu() for t in (buf.qo_indptr, buf.kv_indptr, buf.kv_indices, buf.out_cache_loc)]
        want_indptr, want_indices = ops.build_verify_indices(*cpu)
        want_words = ops.convert_tree_mask(buf.tree_mask.cpu(), buf.mask_indptr.cpu(), cpu[0], cpu[1], "full", 30, 1)
        total = int(want_indptr[-1])
        assert torch.equal(captured[0].cpu(), want_indptr)
        assert torch.equal(captured[1][:total].cpu(), want_indices[:total])
        assert torch.equal(captured[2].cpu(), want_words)
        assert torch.equal(captured[3].cpu(), want_indptr)
        assert torch.equal(captured[4][:total].cpu(), want_indices[:total])
        assert torch.equal(captured[5].cpu(), want_words)


@pytest.mark.parametrize("backend", cuda_backends())
def test_verify_step_replays_in_cuda_graph(backend):
    heads = 16
    buf = StaticBuffers(rows=31, heads=heads, pool=120_000, max_prefix_tokens=100_000, max_mask=4_000_000, batch=3)
    buf.load(make_verify_batch([5000, 100, 20000], [8, 5, 12], heads, device="cuda"))
    out = torch.empty(31, heads, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(31, heads, device="cuda")
    sm_scale = 0.1352

    def step():
        mla_tree_verify(buf.q, buf.kv_cache, **buf.kwargs(sm_scale), out=out, lse=lse, backend=backend, max_draft_len=64)

    graph, _ = capture(step)
    for seed, (prefix, drafts) in enumerate([([70000, 3, 9], [3, 12, 9]), ([1, 1, 1], [1, 1, 1]), ([9000, 9000, 64], [16, 4, 7])]):
        buf.load(make_verify_batch(prefix, drafts, heads, device="cuda", seed=seed + 11))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        ref_out, ref_lse = mla_tree_verify(buf.q, buf.kv_cache, **buf.kwargs(sm_scale), backend="reference")
        assert_matches_reference(out, lse, ref_out, ref_lse)


def test_reduce_overhead_is_cudagraphed_and_correct():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    def step(q, kv, qo, kvp, kvi, ocl, mask, mptr):
        out, lse = mla_tree_verify(q, kv, qo_indptr=qo, kv_indptr=kvp, kv_indices=kvi, out_cache_loc=ocl,
                                   tree_mask=mask, mask_indptr=mptr, sm_scale=0.1352)
        return out.float() * 1.0, lse

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for seed in range(3):
        vb = make_verify_batch([300, 20], [6, 9], 16, device="cuda", pad_rows=1, seed=seed)
        args = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)
        torch.compiler.cudagraph_mark_step_begin()
        out, lse = compiled(*args)
        ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
        assert relative_error(out.clone(), ref_out) < 2e-2
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_two_streams_at_once():
    cases = [make_verify_batch([4000, 10], [16, 4], 16, device="cuda", seed=s, pad_rows=2) for s in (1, 2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for vb, stream in zip(cases, streams):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results.append(mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs()))
    torch.cuda.synchronize()
    for vb, (out, lse) in zip(cases, results):
        ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
        assert_matches_reference(out, lse, ref_out, ref_lse)


def test_repeated_calls_are_bitwise_identical():
    vb = make_verify_batch([30000], [8], 16, device="cuda", pad_rows=1)  # split-KV path
    first = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    for _ in range(3):
        again = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
