"""torch.library.opcheck on every op (schema, fake tensor, aot dispatch), several samples each."""

import pytest
import torch

from conftest import needs_cuda
from ddtree_op import ops
from ddtree_op.api import mask_words_per_row
from ddtree_op.contract import plan_numel
from ddtree_op.synthetic import make_verify_batch

SAMPLES = [([5, 0], [3, 2], 2, "full"), ([12], [6], 1, "qlen"), ([3, 9, 1], [1, 4, 2], 4, "packed")]


def _samples(device):
    for i, (prefix, drafts, heads, layout) in enumerate(SAMPLES):
        vb = make_verify_batch(prefix, drafts, heads, layout=layout, device=device, pad_rows=i, seed=i)
        num_rows = vb.q.shape[0]
        words = mask_words_per_row(vb.tree_mask, layout, num_rows, None)
        verify_indptr, verify_indices = ops.build_verify_indices(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc)
        mask_words = ops.convert_tree_mask(vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, layout, num_rows, words)
        yield vb, num_rows, words, verify_indptr, verify_indices, mask_words


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_opcheck_all_ops(device):
    for vb, num_rows, words, verify_indptr, verify_indices, mask_words in _samples(device):
        torch.library.opcheck(ops.build_verify_indices, (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc))
        torch.library.opcheck(ops.convert_tree_mask, (vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, vb.mask_layout, num_rows, words))
        torch.library.opcheck(ops.prepare_verify, (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                                   vb.mask_indptr, vb.mask_layout, num_rows, words))
        heads = vb.q.shape[1]
        plan = torch.randint(0, 100, (plan_numel(num_rows, heads, vb.qo_indptr.numel() - 1),), device=device)  # stale values
        torch.library.opcheck(ops.prepare_verify, (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                                   vb.mask_indptr, vb.mask_layout, num_rows, words, 2**31 - 1, 0, None, plan,
                                                   heads))
        attn_args = (vb.q, vb.kv_cache, vb.qo_indptr, verify_indptr, verify_indices, mask_words, vb.sm_scale)
        torch.library.opcheck(ops.tree_attention, attn_args)
        # Out-buffers hold random data, so an undeclared or missing write would show.
        out = torch.randn(num_rows, vb.q.shape[1], 512, device=device).to(vb.q.dtype)
        lse = torch.randn(num_rows, vb.q.shape[1], device=device)
        torch.library.opcheck(ops.tree_attention_into, attn_args + (out, lse))
        ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr,
                           vb.mask_layout, num_rows, words, 2**31 - 1, 0, None, plan, heads)  # the plan the attention reads
        torch.library.opcheck(ops.tree_attention, attn_args + ("auto", None, 1.0, plan))
