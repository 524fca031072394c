"""Which implementation runs the attention op, per device and `backend` argument."""

from __future__ import annotations

import torch

from .reference import tree_attention_reference

BACKENDS = ("auto", "reference", "triton", "cutlass")


# "auto" on CUDA: the Triton kernel until the sm_90a CUTLASS kernel exists.
AUTO_CUDA_BACKEND = "triton"


def run_tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend):
    if backend not in BACKENDS:
        raise ValueError(f"ddtree_op: argument 'backend' must be one of {BACKENDS}, got {backend!r}")
    args = (q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse)
    if q.device.type != "cuda":
        if backend not in ("auto", "reference"):
            raise RuntimeError(f"ddtree_op: backend {backend!r} needs CUDA tensors; on {q.device} only the reference runs")
        tree_attention_reference(*args)
        return
    chosen = AUTO_CUDA_BACKEND if backend == "auto" else backend
    with torch.cuda.device(q.device):
        if chosen == "reference":
            tree_attention_reference(*args)
        elif chosen == "triton":
            from .triton_attention import tree_attention_triton

            tree_attention_triton(*args)
        else:
            raise RuntimeError(
                "ddtree_op: no CUTLASS kernel is available in this build of ddtree_op; "
                "use backend='triton' or backend='auto'"
            )
