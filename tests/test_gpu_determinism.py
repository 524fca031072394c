"""The verify step's output is bitwise the same from run to run: no atomics in the reductions, the
split partials merged in a fixed order, the persistent schedule's segments fixed by the plan."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import SCHEDULE_CASES, cuda_backends, poisoned_outputs
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch

pytestmark = needs_cuda

# Each path of the backends, and a 128-head compute-bound request.
CASES = SCHEDULE_CASES + [([4096], [64], 128)]


@pytest.mark.parametrize("backend", cuda_backends())
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[2]}-B{len(c[0])}-n{max(c[1])}-P{max(c[0])}")
def test_repeated_steps_are_bitwise_equal(case, backend):
    prefix, drafts, heads = case
    vb = make_verify_batch(prefix, drafts, heads, device="cuda", pad_rows=3, seed=heads + len(prefix))
    results = []
    for _ in range(3):
        out, lse = poisoned_outputs(vb)
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend=backend)
        results.append((out, lse))
    assert not torch.isnan(results[0][0]).any() and not torch.isnan(results[0][1]).any()
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0])
        assert torch.equal(lse, results[0][1])
