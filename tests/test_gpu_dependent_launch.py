"""The verify step's kernels launched as dependents of the kernel before each (programmatic
dependent launch, cutlass_kernels/grid_dependency.cuh) give what they give launched one after
another (DDTREE_PDL=0), bit for bit, eagerly and in a replayed CUDA graph whose steps follow one
another with no host in between."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import SCHEDULE_CASES, assert_matches_reference, cuda_backends, env_modes, poisoned_outputs
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

pytestmark = needs_cuda


@pytest.mark.parametrize("backend", cuda_backends())
@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda c: f"H{c[2]}-B{len(c[0])}-P{max(c[0])}")
def test_chained_launches_match_plain_ones(case, backend, monkeypatch):
    prefix, drafts, heads = case
    vb = make_verify_batch(prefix, drafts, heads, device="cuda", pad_rows=3, seed=len(prefix) + heads)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    results = {}
    for mode in env_modes(monkeypatch, "DDTREE_PDL", {"chained": None, "plain": "0"}):
        out, lse = poisoned_outputs(vb)
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend=backend)
        assert_matches_reference(out, lse, ref_out, ref_lse)
        results[mode] = (out, lse)
    assert torch.equal(results["chained"][0], results["plain"][0])
    assert torch.equal(results["chained"][1], results["plain"][1])


@pytest.mark.parametrize("backend", cuda_backends())
def test_chained_steps_back_to_back_in_a_graph(backend, monkeypatch):
    """Three steps of different batches captured in one graph, each step's preparation right after
    the previous step's combine, replayed after the inputs change in place: each step reads only
    what the kernels before it finished writing."""
    monkeypatch.delenv("DDTREE_PDL", raising=False)
    batches = [make_verify_batch(p, n, h, device="cuda", pad_rows=2, seed=s)
               for s, (p, n, h) in enumerate([([8192, 3000], [16, 16], 16), ([700], [4], 128), ([2000] * 6, [8] * 6, 16)])]
    outputs = [poisoned_outputs(vb) for vb in batches]

    def steps():
        for vb, (out, lse) in zip(batches, outputs):
            mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend=backend, max_draft_len=16)

    steps()  # warm-up: builds, compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    for round_ in range(2):
        gen = torch.Generator(device="cuda").manual_seed(100 + round_)
        for vb, (out, lse) in zip(batches, outputs):
            vb.q.copy_(torch.randn(vb.q.shape, device="cuda", generator=gen).to(vb.q.dtype))
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for vb, (out, lse) in zip(batches, outputs):
            ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
            assert_matches_reference(out, lse, ref_out, ref_lse)
