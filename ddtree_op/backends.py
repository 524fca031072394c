"""Which implementation runs the attention op, per device and `backend` argument."""

from __future__ import annotations

import functools
import os
import warnings

import torch

from . import build
from .reference import tree_attention_reference

BACKENDS = ("auto", "reference", "triton", "cutlass")


# The sm_90a kernel (cutlass_kernels/sm90/) runs on compute capability 9.0 only; "auto" picks it
# there and the Triton fallback elsewhere. DDTREE_DISABLE_SM90=1 makes "auto" use Triton (an
# escape hatch for serving if the JIT build of the sm_90a library is not wanted).
DISABLE_SM90_ENV = "DDTREE_DISABLE_SM90"


def sm90_kernel_available(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


@functools.lru_cache(maxsize=None)
def _warn_no_cutlass_headers() -> None:
    warnings.warn("ddtree_op: this GPU runs the sm_90a kernel, but the CUTLASS headers it is built with are not "
                  "installed (`pip install --no-deps nvidia-cutlass`); backend 'auto' uses the slower Triton kernel")


def auto_cuda_backend(device: torch.device) -> str:
    """The sm_90a kernel on compute capability 9.0 when its JIT build can find the CUTLASS
    headers, else the Triton kernel (with a warning, once, where only the headers are missing)."""
    if os.environ.get(DISABLE_SM90_ENV, "0") == "1" or not sm90_kernel_available(device):
        return "triton"
    if not build.cutlass_headers_available():
        _warn_no_cutlass_headers()
        return "triton"
    return "cutlass"


def sm90_accepts(q: torch.Tensor, kv_rows: torch.Tensor, out: torch.Tensor) -> bool:
    """The sm_90a kernel copies q and KV rows and stores output rows in 16-byte pieces, so every
    row must be 16-byte aligned (base pointer, and token/head/slot strides in multiples of 8
    elements). The Triton kernel takes any strides, so "auto" sends others there."""
    def rows_aligned(t, elements, alignment):
        return t.data_ptr() % alignment == 0 and all(stride % elements == 0 for stride in t.stride()[:-1])

    return rows_aligned(q, 8, 16) and rows_aligned(kv_rows, 8, 16) and rows_aligned(out, 8, 16)


def run_tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend):
    if backend not in BACKENDS:
        raise ValueError(f"ddtree_op: argument 'backend' must be one of {BACKENDS}, got {backend!r}")
    args = (q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse)
    if q.device.type != "cuda":
        if backend not in ("auto", "reference"):
            raise RuntimeError(f"ddtree_op: backend {backend!r} needs CUDA tensors; on {q.device} only the reference runs")
        tree_attention_reference(*args)
        return
    chosen = auto_cuda_backend(q.device) if backend == "auto" else backend
    if backend == "auto" and chosen == "cutlass" and not sm90_accepts(q, kv_cache, out):
        chosen = "triton"
    with torch.cuda.device(q.device):
        if chosen == "reference":
            tree_attention_reference(*args)
        elif chosen == "triton":
            from .triton_attention import tree_attention_triton

            tree_attention_triton(*args)
        elif sm90_kernel_available(q.device):
            from .sm90_attention import tree_attention_sm90

            tree_attention_sm90(*args)
        else:
            capability = ".".join(map(str, torch.cuda.get_device_capability(q.device)))
            raise RuntimeError(
                f"ddtree_op: backend 'cutlass' (the sm_90a kernel) needs a compute capability 9.0 GPU; {q.device} is "
                f"{capability}: use backend='triton' or 'auto'"
            )
