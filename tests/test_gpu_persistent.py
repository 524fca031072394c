"""The sm_90a persistent kernel on every shape and both device plans, and under CUDA-graph replay."""

import pytest
import torch

import test_gpu_graphs
from conftest import needs_cuda
from gpu_cases import (ATTENTION_CASES, EDGE_CASES, LANE_CASES, PERSISTENT_SCHEDULES, assert_matches_reference, case_id,
                       cuda_backends, make_gpu_case, needs_sm90, run_sm90)
from ddtree_op import mla_tree_verify

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
