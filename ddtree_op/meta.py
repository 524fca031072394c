"""Fake (meta) implementations: output metadata from input shapes only, for torch.compile."""

from __future__ import annotations

import torch

from .contract import LATENT_DIM


def build_verify_indices_fake(qo_indptr, kv_indptr, kv_indices, out_cache_loc):
    batch = qo_indptr.shape[0] - 1
    verify_indptr = qo_indptr.new_empty(batch + 1, dtype=torch.int32)
    verify_indices = qo_indptr.new_empty(kv_indices.shape[0] + out_cache_loc.shape[0], dtype=torch.int32)
    return verify_indptr, verify_indices


def convert_tree_mask_fake(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row):
    return qo_indptr.new_empty((num_rows, words_per_row), dtype=torch.int64)


def prepare_verify_fake(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows, words_per_row,
                        num_slots=2**31 - 1, max_draft_len=0, status=None, plan=None, heads=0, publish_status=True):
    verify_indptr, verify_indices = build_verify_indices_fake(qo_indptr, kv_indptr, kv_indices, out_cache_loc)
    mask_words = convert_tree_mask_fake(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row)
    qo_indptr_out = qo_indptr.new_empty(qo_indptr.shape[0], dtype=torch.int32)  # sanitized; status and plan are written in place
    return verify_indptr, verify_indices, mask_words, qo_indptr_out


def tree_attention_fake(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, backend="auto", kv_scale=None,
                        kv_scale_value=1.0, plan=None, status=None):  # status is written in place
    tokens, heads = q.shape[0], q.shape[1]
    out = q.new_empty((tokens, heads, LATENT_DIM))
    lse = q.new_empty((tokens, heads), dtype=torch.float32)
    return out, lse


def tree_attention_into_fake(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend="auto",
                             kv_scale=None, kv_scale_value=1.0, plan=None, status=None):
    return None


def paged_slot_lists_fake(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    batch = qo_indptr.shape[0] - 1
    kv_indptr = qo_indptr.new_empty(batch + 1, dtype=torch.int32)
    kv_indices = qo_indptr.new_empty(batch * block_table.shape[1] * page_size, dtype=torch.int32)
    out_cache_loc = qo_indptr.new_empty(num_rows, dtype=torch.int32)
    return kv_indptr, kv_indices, out_cache_loc
