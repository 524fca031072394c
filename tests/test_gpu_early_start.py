"""The sm90 split kernel's early start (cutlass_kernels/sm90/early_schedule.cuh): started while the
preparation still runs, it finds its row block and reads its slots from the raw batch, and must
give what it gives when it waits for the preparation's outputs (DDTREE_EARLY_START=0), bit for
bit, status included: on valid batches of every shape class, mask layout and index dtype, on
every bad value of the bounds-safety table, and in a replayed CUDA graph whose batch changes."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import (ATTENTION_CASES, EDGE_CASES, SCHEDULE_CASES, assert_matches_reference, case_id, env_modes,
                       poisoned_outputs)
from test_bounds_safety import CASES as BAD_CASES, _batch as bad_batch
import ddtree_op
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

pytestmark = [needs_cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                             reason="the early start is the sm_90a kernel's: needs an sm_90 GPU")]

VALID_CASES = SCHEDULE_CASES + ATTENTION_CASES + EDGE_CASES


def _both_starts(vb, kwargs, monkeypatch, max_draft_len=None):
    """(out, lse, status) of the step started early and started after the preparation."""
    results = {}
    for mode in env_modes(monkeypatch, "DDTREE_EARLY_START", {"early": None, "waiting": "0"}):
        out, lse = poisoned_outputs(vb)
        status = ddtree_op.new_status("cuda")
        mla_tree_verify(vb.q, vb.kv_cache, **kwargs, out=out, lse=lse, backend="sm90", status=status,
                        max_draft_len=max_draft_len)
        torch.cuda.synchronize()
        results[mode] = (out, lse, status)
    return results


def _assert_same(results):
    (out_e, lse_e, st_e), (out_w, lse_w, st_w) = results["early"], results["waiting"]
    assert not out_e.isnan().any() and not lse_e.isnan().any(), "the early start left rows unwritten"
    assert torch.equal(out_e, out_w) and torch.equal(lse_e, lse_w), "the early start differs from the waiting start"
    assert torch.equal(st_e, st_w), (st_e.tolist(), st_w.tolist())


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("case", VALID_CASES, ids=case_id)
def test_early_start_is_the_waiting_start(case, index_dtype, monkeypatch):
    prefix, drafts, heads = case
    vb = make_verify_batch(prefix, drafts, heads, device="cuda", pad_rows=3, seed=len(prefix) + heads, index_dtype=index_dtype)
    results = _both_starts(vb, vb.kwargs(), monkeypatch)
    _assert_same(results)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert_matches_reference(results["early"][0], results["early"][1], ref_out, ref_lse)


@pytest.mark.parametrize("layout", ["qlen", "packed"])
def test_early_start_reads_every_mask_layout(layout, monkeypatch):
    vb = make_verify_batch([3000, 70, 0], [16, 5, 9], 16, device="cuda", layout=layout, pad_rows=2, seed=3)
    _assert_same(_both_starts(vb, vb.kwargs(), monkeypatch))


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
def test_early_start_sanitizes_as_the_preparation(case, monkeypatch):
    """The CTA's own sanitizing of the raw batch is the preparation's: the same rows void, the same
    slots invisible, the same status."""
    vb = bad_batch(case, "cuda")
    kwargs = vb.kwargs()
    case.mutate(vb, kwargs)
    _assert_same(_both_starts(vb, kwargs, monkeypatch, case.max_draft_len))


def test_early_start_in_a_replayed_graph_with_new_lengths(monkeypatch):
    """A captured step replayed after its lengths, slots and tree change in place (same shapes):
    the CTAs find the new row blocks and slots on the device."""
    monkeypatch.delenv("DDTREE_EARLY_START", raising=False)
    batches = [make_verify_batch([5000, 300, 2000, 64], [8, 8, 8, 8], 16, device="cuda", pad_rows=4, seed=1),
               make_verify_batch([100, 5200, 64, 2000], [4, 12, 1, 15], 16, device="cuda", pad_rows=4, seed=2)]
    assert batches[0].q.shape == batches[1].q.shape and batches[0].kv_cache.shape == batches[1].kv_cache.shape
    mask_capacity = max(vb.tree_mask.numel() for vb in batches)
    inputs = {name: t.clone() for name, t in batches[0].kwargs().items() if isinstance(t, torch.Tensor)}
    inputs["tree_mask"] = torch.zeros(mask_capacity, dtype=batches[0].tree_mask.dtype, device="cuda")
    q, kv_cache = batches[0].q.clone(), batches[0].kv_cache.clone()
    out, lse = poisoned_outputs(batches[0])

    def load(vb):
        for name, buffer in inputs.items():
            new = vb.kwargs()[name]
            assert new.dtype == buffer.dtype and (name == "tree_mask" or new.shape == buffer.shape), name
            buffer[: new.numel()].copy_(new)
        q.copy_(vb.q)
        kv_cache.copy_(vb.kv_cache)

    def step():
        mla_tree_verify(q, kv_cache, **dict(batches[0].kwargs(), **inputs), out=out, lse=lse, backend="sm90",
                        max_draft_len=16)

    load(batches[0])
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for vb in (batches[1], batches[0]):
        load(vb)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
        assert_matches_reference(out, lse, ref_out, ref_lse)
