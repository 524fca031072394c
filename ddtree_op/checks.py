"""Argument checks for the verify step.

`check_verify_shapes` reads only shapes, dtypes, strides and devices, so it always runs (also
while tracing and capturing). `check_verify_inputs` reads index values on the host; it is for
eager debugging (`DDTREE_CHECK=1`) and tests, never inside capture or compile.
"""

from __future__ import annotations

import math

import torch

from .contract import LATENT_DIM, MASK_LAYOUTS, PACKED_MASK_BITS, QK_DIM
from .status import check_status_tensor, new_status, raise_on_status

INDEX_DTYPES = (torch.int32, torch.int64)
INDEX_LIMIT = 2**31 - 1  # verify indices and indptrs are int32
# |sm_scale| above this can overflow float32 logits even for q, k within the fp16 range:
# 576 * 65504^2 * log2(e) * scale must stay below float32's max (about 3.4e38) with room to spare.
MAX_ABS_SM_SCALE = 3.4e38 / (2 * 1.4426950408889634 * 576 * 65504.0**2)
ATTENTION_DTYPES = (torch.bfloat16, torch.float16)
# An FP8 e4m3 cache, or the uint8 bytes of one (SGLang's storage), read with a per-tensor scale.
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def _fail(name: str, expected: str, got: str) -> None:
    raise ValueError(f"ddtree_op: argument '{name}' must be {expected}, got {got}")


def _check_tensor(name: str, t, *, ndim: int | None = None, dtypes=None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, "a torch.Tensor", type(t).__name__)
    if ndim is not None and t.dim() != ndim:
        _fail(name, f"{ndim}-dimensional", f"shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        _fail(name, f"of dtype {' or '.join(str(d) for d in dtypes)}", str(t.dtype))
    if device is not None and t.device != device:
        _fail(name, f"on {device} (the device of q)", str(t.device))


def check_status_argument(status, device) -> None:
    """A caller's status tensor: its layout (ddtree_op.new_status) and its device."""
    check_status_tensor(status)
    _check_tensor("status", status, device=device)


def kv_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """[S, 576] view of a `[S, 576]` or `[S, 1, 576]` KV pool (no copy)."""
    return kv_cache.select(1, 0) if kv_cache.dim() == 3 else kv_cache


def check_verify_shapes(
    q,
    kv_cache,
    qo_indptr,
    kv_indptr,
    kv_indices,
    out_cache_loc,
    tree_mask,
    mask_indptr,
    sm_scale,
    mask_layout,
    out=None,
    lse=None,
    max_draft_len=None,
    status=None,
) -> None:
    """Every check of `mla_tree_verify` that reads no index value."""
    check_query_and_cache(q, kv_cache)
    check_index_arguments(q, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, max_draft_len)
    check_attention_arguments(q, sm_scale, out, lse)
    if status is not None:
        check_status_argument(status, q.device)


def check_query_and_cache(q, kv_cache) -> None:
    """q [T, H, 576] and a token-slot pool [S, (1,) 576] on its device."""
    _check_tensor("q", q, ndim=3, dtypes=ATTENTION_DTYPES)
    dev = q.device
    if q.shape[-1] != QK_DIM or q.shape[1] == 0:
        _fail("q", f"[T, H, {QK_DIM}] with H >= 1", f"shape {tuple(q.shape)}")
    if q.stride(-1) != 1:
        _fail("q", "contiguous in its last dimension", f"strides {q.stride()}")

    _check_tensor("kv_cache", kv_cache, device=dev)
    if kv_cache.dim() not in (2, 3) or kv_cache.shape[-1] != QK_DIM or (kv_cache.dim() == 3 and kv_cache.shape[1] != 1):
        _fail("kv_cache", f"[S, {QK_DIM}] or [S, 1, {QK_DIM}]", f"shape {tuple(kv_cache.shape)}")
    if kv_cache.dtype != q.dtype and kv_cache.dtype not in FP8_KV_DTYPES:
        _fail("kv_cache", f"of the dtype of q ({q.dtype}), or float8_e4m3fn (or its uint8 bytes)", str(kv_cache.dtype))
    rows = kv_rows(kv_cache)
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) < QK_DIM):
        _fail("kv_cache", f"contiguous in its last dimension with row stride >= {QK_DIM}", f"strides {kv_cache.stride()}")


def check_index_arguments(q, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                          max_draft_len) -> None:
    """The index tensors, the mask and max_draft_len: dtypes, sizes and the device of q."""
    dev = q.device
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("out_cache_loc", out_cache_loc)):
        _check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, device=dev)
    if qo_indptr.numel() < 1:
        _fail("qo_indptr", "of length B+1 >= 1", "an empty tensor")
    batch = qo_indptr.numel() - 1
    if batch + 1 > INDEX_LIMIT:  # request indices and indptr positions are int32 in every kernel
        _fail("qo_indptr", f"of at most {INDEX_LIMIT} entries (positions are int32)", f"length {batch + 1}")
    if kv_indptr.numel() < batch + 1:
        _fail("kv_indptr", f"of length >= B+1 = {batch + 1} (B from qo_indptr)", f"length {kv_indptr.numel()}")

    if mask_layout not in MASK_LAYOUTS:
        _fail("mask_layout", f"one of {MASK_LAYOUTS}", repr(mask_layout))
    _check_tensor("tree_mask", tree_mask, device=dev)
    if mask_layout == "packed":
        if tree_mask.dtype not in PACKED_MASK_BITS:
            _fail("tree_mask", "an integer tensor for mask_layout 'packed' (uint8, int16, uint16, int32, uint32, int64)", str(tree_mask.dtype))
        if tree_mask.dim() != 1:
            _fail("tree_mask", "1-dimensional (one word per draft row) for mask_layout 'packed'", f"shape {tuple(tree_mask.shape)}")
        if max_draft_len is not None and max_draft_len > PACKED_MASK_BITS[tree_mask.dtype]:
            _fail("max_draft_len", f"<= {PACKED_MASK_BITS[tree_mask.dtype]} for a {tree_mask.dtype} packed mask", str(max_draft_len))
    elif tree_mask.dtype not in (torch.bool, torch.uint8):
        _fail("tree_mask", f"bool or uint8 for mask_layout {mask_layout!r}", str(tree_mask.dtype))
    if mask_indptr is None:
        if mask_layout == "full":
            _fail("mask_indptr", "a tensor for mask_layout 'full'", "None")
    else:
        _check_tensor("mask_indptr", mask_indptr, ndim=1, dtypes=INDEX_DTYPES, device=dev)
        if mask_indptr.numel() < batch + 1:
            _fail("mask_indptr", f"of length >= B+1 = {batch + 1}", f"length {mask_indptr.numel()}")

    if kv_indices.numel() + out_cache_loc.numel() >= INDEX_LIMIT:
        _fail("kv_indices", f"shorter than {INDEX_LIMIT} entries together with out_cache_loc (verify indices are int32)",
              f"{kv_indices.numel()} + {out_cache_loc.numel()}")
    if max_draft_len is not None and (not isinstance(max_draft_len, int) or max_draft_len < 1):
        _fail("max_draft_len", "a positive int or None", repr(max_draft_len))


def check_attention_arguments(q, sm_scale, out=None, lse=None) -> None:
    """sm_scale and the optional out / lse buffers of an attention over q."""
    dev = q.device
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (float, int)) or not math.isfinite(sm_scale):
        _fail("sm_scale", "a finite float", repr(sm_scale))
    if abs(sm_scale) > MAX_ABS_SM_SCALE:
        _fail("sm_scale", f"at most {MAX_ABS_SM_SCALE:.3g} in magnitude (larger scales overflow float32 logits to "
              "inf - inf = NaN)", repr(sm_scale))
    tokens, heads = q.shape[0], q.shape[1]
    if out is not None:
        _check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=dev)
        if tuple(out.shape) != (tokens, heads, LATENT_DIM):
            _fail("out", f"of shape {(tokens, heads, LATENT_DIM)}", f"shape {tuple(out.shape)}")
        if out.stride(-1) != 1:  # both kernels write a row's 512 columns contiguously
            _fail("out", "contiguous in its last dimension", f"strides {out.stride()}")
    if lse is not None:
        _check_tensor("lse", lse, ndim=2, dtypes=(torch.float32,), device=dev)
        if tuple(lse.shape) != (tokens, heads):
            _fail("lse", f"of shape {(tokens, heads)}", f"shape {tuple(lse.shape)}")


def check_kv_scale(kv_cache, kv_scale, device) -> None:
    """kv_scale: None, or for an FP8 cache a finite python float or a float32 tensor of one
    element on the device of q (read there, so it may change between CUDA-graph replays)."""
    if kv_scale is None:
        return
    if kv_cache.dtype not in FP8_KV_DTYPES:
        _fail("kv_scale", f"None for a {kv_cache.dtype} kv_cache (a scale is for an FP8 cache)", repr(kv_scale))
    if isinstance(kv_scale, torch.Tensor):
        _check_tensor("kv_scale", kv_scale, dtypes=(torch.float32,), device=device)
        if kv_scale.numel() != 1:
            _fail("kv_scale", "a float32 tensor of one element", f"shape {tuple(kv_scale.shape)}")
    elif isinstance(kv_scale, bool) or not isinstance(kv_scale, (float, int)) or not math.isfinite(kv_scale):
        _fail("kv_scale", "a finite float or a float32 tensor of one element", repr(kv_scale))


def check_verify_inputs(
    q,
    kv_cache,
    *,
    qo_indptr,
    kv_indptr,
    kv_indices,
    out_cache_loc,
    tree_mask,
    mask_indptr=None,
    sm_scale,
    mask_layout="full",
    out=None,
    lse=None,
    max_draft_len=None,
) -> None:
    """Every check of `mla_tree_verify`, including those that read index values (host sync).

    The value checks are the preparation's own (`prep.prepare_verify_checked`, the same rules as
    the CUDA launch) run with a status on the device of q, then `raise_on_status`: an eager call
    and a status read after a captured step raise the same error."""
    check_verify_shapes(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, sm_scale, mask_layout, out, lse, max_draft_len)
    check_index_values(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                       max_draft_len)


def check_index_values(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout,
                       max_draft_len) -> None:
    """The checks of `check_verify_inputs` that read index values (after its shape checks)."""
    from .api import mask_words_per_row
    from .prep import prepare_verify_checked

    status = new_status(q.device)
    words = mask_words_per_row(tree_mask, mask_layout, q.shape[0], max_draft_len)
    prepare_verify_checked(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, mask_layout, q.shape[0],
                           words, kv_rows(kv_cache).shape[0], max_draft_len or 0, status)
    raise_on_status(status)
