"""Which implementation runs the attention op, per device and `backend` argument."""

from __future__ import annotations

import os

import torch

from .reference import tree_attention_reference

BACKENDS = ("auto", "reference", "triton", "cutlass")


# "auto" on CUDA: the Triton kernel until the sm_90a CUTLASS kernel has passed the GPU tests.
AUTO_CUDA_BACKEND = "triton"
# The sm_90a kernel compiles (HGMMA in SASS) but has not yet run on a GPU: opt in explicitly.
EXPERIMENTAL_SM90_ENV = "DDTREE_EXPERIMENTAL_SM90"


def sm90_kernel_enabled(device: torch.device) -> bool:
    return os.environ.get(EXPERIMENTAL_SM90_ENV, "0") == "1" and torch.cuda.get_device_capability(device) == (9, 0)


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
        elif sm90_kernel_enabled(q.device):
            from .sm90_attention import tree_attention_sm90

            tree_attention_sm90(*args)
        else:
            raise RuntimeError(
                "ddtree_op: backend 'cutlass' (the sm_90a kernel) is not available: it needs an sm_90 GPU and, "
                f"until it has passed the GPU tests, {EXPERIMENTAL_SM90_ENV}=1; use backend='triton' or 'auto'"
            )
