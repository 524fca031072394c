"""The sm_90a persistent kernel on every shape and both device plans, under CUDA-graph replay, and
layer after layer of one prepared step (the merge counts in its plan)."""

import pytest
import torch

import test_gpu_graphs
from conftest import needs_cuda
from gpu_cases import (ATTENTION_CASES, EDGE_CASES, LANE_CASES, PERSISTENT_SCHEDULES, assert_matches_reference, case_id,
                       cuda_backends, make_gpu_case, needs_sm90, run_sm90)
from ddtree_op import contract, mla_tree_verify, mla_tree_verify_prepared, prepare_tree_verify

pytestmark = [needs_cuda, needs_sm90]


@pytest.mark.parametrize("ctas,splits", PERSISTENT_SCHEDULES)
@pytest.mark.parametrize("case", ATTENTION_CASES + EDGE_CASES + LANE_CASES, ids=case_id)
def test_persistent_kernel_matches_reference(case, ctas, splits):
    """The persistent kernel on every shape, whatever `auto` would pick: 1 CTA walks every row
    block; 5 cut most of them or take several pieces; 132 (one per SM) leave some CTAs idle when
    the batch is small. Which plan each case gets (pieces or equal shares) is checked on the CPU
    (tests/test_persistent_schedule.py: both occur). Padding rows, requests with no drafts and rows
    that see no key included."""
    if "sm90" not in cuda_backends():
        pytest.skip("the sm_90a kernel needs an sm_90 GPU")
    index = (ATTENTION_CASES + EDGE_CASES + LANE_CASES).index(case)
    dtype = torch.float16 if ctas == 5 else torch.bfloat16
    vb = make_gpu_case(case, "full", dtype, seed=100 + index + ctas)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert_matches_reference(*run_sm90(vb, schedule="persistent", ctas=ctas, num_splits=splits), ref_out, ref_lse)


def test_persistent_kernel_replays_in_cuda_graph(monkeypatch):
    """One captured step, replayed with batches for which the device plans equal shares (unequal
    requests) and pieces (equal ones): the plan changes with the lengths, not the graph."""
    monkeypatch.setattr("ddtree_op.backends.sm90.attention.use_persistent", lambda *args: True)
    test_gpu_graphs.test_verify_step_replays_in_cuda_graph("sm90")


# (case, equal shares?) on an H200's 132 SMs: 6 row blocks in pieces of 22 splits; equal shares
# that cut row blocks into up to 11 pieces.
PREPARED_CASES = [(([3000, 700, 9000], [8, 8, 8], 16), False), (([12000, 300, 5000], [32, 32, 32], 16), True)]


@pytest.mark.parametrize("case,equal_shares", PREPARED_CASES)
def test_layers_of_a_prepared_step_each_merge_their_cut_row_blocks(monkeypatch, case, equal_shares):
    """The CTA that writes a cut row block's last partial merges them and sets the row block's count
    in the plan back to 0, so every layer that reads the plan merges again. Each layer matches the
    reference, the same q gives the same bits, and the counts are 0 after the last layer."""
    if "sm90" not in cuda_backends():
        pytest.skip("the sm_90a kernel needs an sm_90 GPU")
    monkeypatch.setattr("ddtree_op.backends.sm90.attention.use_persistent", lambda *args: True)
    vb = make_gpu_case(case, "full", torch.bfloat16, seed=11)
    kwargs = vb.kwargs()
    del kwargs["sm_scale"]
    prepared = prepare_tree_verify(vb.q, vb.kv_cache, **kwargs)
    gen = torch.Generator(device="cuda").manual_seed(12)
    layers = [torch.randn(vb.q.shape, generator=gen, device="cuda").to(vb.q.dtype) for _ in range(3)]
    first = None
    for q in layers + layers[:1]:
        out, lse = mla_tree_verify_prepared(q, vb.kv_cache, prepared, sm_scale=vb.sm_scale, backend="sm90")
        ref_out, ref_lse = mla_tree_verify(q, vb.kv_cache, **vb.kwargs(), backend="reference")
        assert_matches_reference(out, lse, ref_out, ref_lse)
        first = first or (out, lse)
    assert torch.equal(out, first[0]) and torch.equal(lse, first[1])
    shapes = (vb.q.shape[0], vb.q.shape[1], vb.qo_indptr.numel() - 1)
    start, capacity = contract.plan_partials_written_offset(*shapes), contract.plan_capacity(*shapes)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:  # the plans the cases were chosen for
        assert prepared.plan[contract.PLAN_EQUAL_SHARES].item() == equal_shares
    assert not prepared.plan[start:start + capacity].any()
