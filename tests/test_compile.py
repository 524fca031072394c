"""mla_tree_verify under torch.compile(fullgraph=True): one frame, no recompile across shapes."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import needs_cuda, relative_error
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE, make_verify_batch


def verify_step(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr):
    out, lse = mla_tree_verify(
        q, kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, out_cache_loc=out_cache_loc,
        tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=DEEPSEEK_V3_SM_SCALE,
    )
    return out * 2, lse + 1  # surrounding work so inductor has something to fuse


def _inputs(vb):
    return (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)


def _mark_dynamic(args):
    for t in args:
        torch._dynamo.mark_dynamic(t, 0)


# (prefix lengths, draft lengths): three token counts, two batch sizes.
SHAPES = [([20, 7], [4, 6]), ([33, 2], [9, 8]), ([5, 11, 40], [8, 8, 8])]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_fullgraph_one_frame_no_recompile(device):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(verify_step, backend=counter, fullgraph=True)
    for i, (prefix, drafts) in enumerate(SHAPES):
        vb = make_verify_batch(prefix, drafts, 2, device=device, pad_rows=2, seed=i)
        args = _inputs(vb)
        _mark_dynamic(args)
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            out, lse = compiled(*args)
        want_out, want_lse = verify_step(*args)
        assert relative_error(out, want_out) < 1e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert counter.frame_count == 1


def test_explain_reports_no_graph_break():
    vb = make_verify_batch([10, 3], [5, 2], 2, pad_rows=1)
    explanation = torch._dynamo.explain(verify_step)(*_inputs(vb))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
