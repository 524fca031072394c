"""Device-side preparation of a verify step: combined indices and compact tree masks.

Both functions are plain tensor programs (searchsorted, gathers, shifts) whose output shapes
depend on input shapes only. They read no value on the host, so they run unchanged on CPU and
CUDA, inside `torch.compile` graphs and inside captured CUDA graphs. They are the CPU
implementations of `ddtree::build_verify_indices` and `ddtree::convert_tree_mask`; on CUDA the
same ops run fused kernels (cutlass_kernels/verify_indices.cu, tree_mask.cu), tested against these.
"""

from __future__ import annotations

import torch

from .contract import MASK_LAYOUTS, PACKED_MASK_BITS

# Signed dtype of the same width, so the raw bits can be read with ops every backend has.
_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32}


def _gather_or_zero(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index] with the index clamped into range; zeros when `values` is empty."""
    if values.numel() == 0:
        return torch.zeros_like(index)
    # Gather first, convert after: the mask buffer may be far larger than what is read.
    return values[index.clamp(0, values.numel() - 1)].long()


def build_verify_indices(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request b: `[kv_indices[kv_indptr[b]:kv_indptr[b+1]] ‖ out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]]`.

    Returns (verify_indptr int32 [B+1], verify_indices int32 [N + T]); entries of verify_indices
    past verify_indptr[B] are 0.
    """
    batch = qo_indptr.numel() - 1
    device = qo_indptr.device
    qo = qo_indptr.long()
    kv = kv_indptr[: batch + 1].long()
    prefix_len = kv[1:] - kv[:-1]
    draft_len = qo[1:] - qo[:-1]
    verify_indptr = torch.zeros(batch + 1, dtype=torch.long, device=device)
    torch.cumsum(prefix_len + draft_len, 0, out=verify_indptr[1:])

    total = kv_indices.numel() + out_cache_loc.numel()
    pos = torch.arange(total, device=device)
    if batch == 0:
        return verify_indptr.int(), torch.zeros(total, dtype=torch.int32, device=device)
    req = torch.searchsorted(verify_indptr[1:], pos, right=True).clamp_(max=batch - 1)
    offset = pos - verify_indptr[req]
    req_prefix = prefix_len[req]
    from_prefix = _gather_or_zero(kv_indices, kv[req] + offset)
    from_draft = _gather_or_zero(out_cache_loc, qo[req] + offset - req_prefix)
    slots = torch.where(offset < req_prefix, from_prefix, from_draft)
    slots = torch.where(pos < verify_indptr[batch], slots, torch.zeros_like(slots))
    return verify_indptr.int(), slots.int()


def convert_tree_mask(
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    layout: str,
    num_rows: int,
    words_per_row: int,
) -> torch.Tensor:
    """Compact tree mask: int64 [num_rows, words_per_row]; bit j of word w in row t says that
    draft row t sees draft column 64*w + j of its own request. Padding rows and columns past the
    request's draft count are 0.
    """
    device = qo_indptr.device
    batch = qo_indptr.numel() - 1
    if batch == 0:
        return torch.zeros(num_rows, words_per_row, dtype=torch.long, device=device)
    qo = qo_indptr.long()
    row = torch.arange(num_rows, device=device)
    req = torch.searchsorted(qo[1:], row, right=True)
    row_valid = (req < batch) & (row >= qo[0])
    req = req.clamp_(max=batch - 1)
    draft_len = (qo[1:] - qo[:-1])[req]
    draft_row = row - qo[req]
    col = torch.arange(words_per_row * 64, device=device)
    visible_cell = row_valid[:, None] & (col[None, :] < draft_len[:, None])

    if layout == "packed":
        raw = tree_mask.view(_SIGNED_VIEW.get(tree_mask.dtype, tree_mask.dtype)).reshape(-1)
        width = PACKED_MASK_BITS[tree_mask.dtype]
        word = _gather_or_zero(raw, row)
        bits = (word[:, None] >> col.clamp(max=63)[None, :]) & 1
        bits = bits.bool() & (col[None, :] < width)
    else:
        flat = tree_mask.reshape(-1)
        if layout == "full":
            kv = kv_indptr[: batch + 1].long()
            prefix_len = (kv[1:] - kv[:-1])[req]
            row_start = mask_indptr.long()[req] + draft_row * (prefix_len + draft_len) + prefix_len
        elif layout == "qlen":
            if mask_indptr is not None:
                block_start = mask_indptr.long()[:batch]
            else:
                sizes = (qo[1:] - qo[:-1]) ** 2
                block_start = torch.cumsum(sizes, 0) - sizes
            row_start = block_start[req] + draft_row * draft_len
        else:
            raise ValueError(f"mask_layout must be one of {MASK_LAYOUTS}, got {layout!r}")
        bits = _gather_or_zero(flat, row_start[:, None] + col[None, :]) != 0
    bits = bits & visible_cell
    shifts = torch.arange(64, device=device)
    words = (bits.view(num_rows, words_per_row, 64).long() << shifts).sum(-1)
    return words


def prepare_verify(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None,
    layout: str,
    num_rows: int,
    words_per_row: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both preparation steps of the verify step: (verify_indptr, verify_indices, mask_words).
    The CUDA implementation runs them in one launch."""
    verify_indptr, verify_indices = build_verify_indices(qo_indptr, kv_indptr, kv_indices, out_cache_loc)
    mask_words = convert_tree_mask(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row)
    return verify_indptr, verify_indices, mask_words
