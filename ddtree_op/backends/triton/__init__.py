"""The triton backend: the attention kernel in Triton, for any CUDA GPU Triton supports.

- attention.py: the kernel and its launch;
- schedule.py: how many key splits per row block, from shapes.
Split partials are merged by the shared combine (backends/lse_merge.py). Triton is imported on
first use, so that a CPU-only install without Triton imports ddtree_op.
"""

from __future__ import annotations


def run(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, kv_scale=None,
        kv_scale_value=1.0, status=None) -> None:
    from .attention import tree_attention_triton

    tree_attention_triton(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse,
                          kv_scale=kv_scale, kv_scale_value=kv_scale_value, status=status)
