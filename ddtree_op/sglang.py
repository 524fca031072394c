"""Adapter for SGLang's target-verify (tree speculative decoding) attention on MLA models.

Takes the buffers SGLang's Triton attention backend already holds in `forward_extend` for
ForwardMode.TARGET_VERIFY and returns the output in SGLang's layout, without copies:

- q: `[T, H * 576]` or `[T, H, 576]` (a view of a larger tensor is fine; last dim contiguous);
- k_buffer: the layer's KV buffer `[S, 1, 576]` (`token_to_kv_pool.get_key_buffer(layer_id)`);
  v_buffer, if given, must be the 512-wide view of the same rows (`get_value_buffer`), since V is
  read from the K rows;
- qo_indptr (int32 eager, int64 in CUDA-graph buffers), kv_indptr int32 covering the prefix only,
  kv_indices int64 (may be longer than needed), custom_mask bool or uint8 (may be a buffer
  preallocated for the largest batch and context), mask_indptr int64, out_cache_loc int64;
- padded CUDA-graph batches (dummy requests with prefix length 1) need nothing special;
- an FP8 k_buffer (float8_e4m3fn or its uint8 bytes) with its `k_scale`.

`target_verify_forward_paged` takes the FlashMLA backend's buffers instead (64-row pages, a block
table, cache_seqlens) with the EAGLE verify input's FULL mask, which that backend cannot apply.
`prepare_target_verify` + `target_verify_forward(..., prepared=)` split a forward's step into one
preparation and one attention per layer.

`sglang` itself is not imported here: `ddtree_op.integrations.sglang` is the backend subclass that
calls this from SGLang's `TritonAttnBackend.forward_extend`.
"""

from __future__ import annotations

import contextlib

import torch

from ddtree_op import PreparedVerify, mla_tree_verify, mla_tree_verify_paged, mla_tree_verify_prepared, prepare_tree_verify
from ddtree_op.contract import LATENT_DIM, QK_DIM
from ddtree_op.status import rename_arguments


# This adapter's names of the arguments that mla_tree_verify's errors (and the status) name.
ARGUMENT_NAMES = {"tree_mask": "custom_mask", "max_draft_len": "num_draft_tokens", "kv_cache": "k_buffer", "out": "o",
                  "kv_scale": "k_scale"}


def _check_same_rows(k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> None:
    # Sizes and strides are traced (and guarded) by dynamo, so this part holds under torch.compile.
    same_layout = (
        v_buffer.dim() == k_buffer.dim()
        and v_buffer.shape[:-1] == k_buffer.shape[:-1]
        and v_buffer.shape[-1] == LATENT_DIM
        and v_buffer.stride() == k_buffer.stride()
        and v_buffer.dtype == k_buffer.dtype
    )
    if not same_layout:
        raise ValueError(
            "ddtree_op: argument 'v_buffer' must be the first 512 columns of the rows of k_buffer "
            f"(MLA stores one latent row per token), got {v_buffer.dtype} shape {tuple(v_buffer.shape)} strides "
            f"{v_buffer.stride()} for k_buffer {k_buffer.dtype} shape {tuple(k_buffer.shape)} strides {k_buffer.stride()}"
        )
    # Same memory, eagerly only: dynamo breaks the graph on the storage offset or data pointer of
    # an input, so under torch.compile only the layout above is checked.
    if not torch.compiler.is_compiling() and (
        v_buffer.untyped_storage().data_ptr() != k_buffer.untyped_storage().data_ptr()
        or v_buffer.storage_offset() != k_buffer.storage_offset()
    ):
        raise ValueError(
            "ddtree_op: argument 'v_buffer' must be the first 512 columns of the rows of k_buffer "
            "(MLA stores one latent row per token), got a tensor in other memory"
        )


def prepare_target_verify(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    *,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    out_cache_loc: torch.Tensor,
    num_draft_tokens: int | None = None,
    status: torch.Tensor | None = None,
) -> PreparedVerify:
    """The verify step's preparation on SGLang's buffers, once per forward: every layer then calls
    `target_verify_forward(..., prepared=)` (its index arguments are then not read). q and
    k_buffer may be any layer's (their shapes are read). `status` is published here."""
    q = _heads_view(q)
    with _adapter_names():
        return prepare_tree_verify(q, k_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                   out_cache_loc=out_cache_loc, tree_mask=custom_mask, mask_indptr=mask_indptr,
                                   mask_layout="full", max_draft_len=num_draft_tokens, status=status)


def target_verify_forward(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    *,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    out_cache_loc: torch.Tensor,
    sm_scale: float,
    num_draft_tokens: int | None = None,
    v_buffer: torch.Tensor | None = None,
    o: torch.Tensor | None = None,
    backend: str = "auto",
    status: torch.Tensor | None = None,
    prepared: PreparedVerify | None = None,
    k_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree-masked MLA verify attention on SGLang's buffers; returns o `[T, H * 512]`.

    `status` (optional, `ddtree_op.new_status()`) records bad index values on the device, as for
    `mla_tree_verify`; `ddtree_op.raise_on_status(status, names=ARGUMENT_NAMES)` names this
    function's arguments. Errors raised here name them too (custom_mask, num_draft_tokens, k_buffer).

    `num_draft_tokens` (SGLang's `speculative_num_draft_tokens`, static) bounds the drafts per
    request and keeps the compact mask small. `o`, when given, is written in place (SGLang's
    `[T, H * 512]` output buffer, contiguous). `prepared` (from `prepare_target_verify` for this
    forward's batch): only the attention runs, over it; the index arguments and `status` are not
    read. `k_scale`: an FP8 k_buffer's scale (SGLang's `layer.k_scale`; float8_e4m3fn or its uint8
    bytes, value = stored x k_scale).
    """
    q = _heads_view(q)
    if v_buffer is not None:
        _check_same_rows(k_buffer, v_buffer)
    o, out = _output(q, o)
    with _adapter_names():
        if prepared is not None:
            mla_tree_verify_prepared(q, k_buffer, prepared, sm_scale=sm_scale, out=out, kv_scale=k_scale, backend=backend)
        else:
            mla_tree_verify(q, k_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            out_cache_loc=out_cache_loc, tree_mask=custom_mask, mask_indptr=mask_indptr, sm_scale=sm_scale,
                            mask_layout="full", out=out, max_draft_len=num_draft_tokens, backend=backend, status=status,
                            kv_scale=k_scale)
    return o


def target_verify_forward_paged(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    *,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    custom_mask: torch.Tensor,
    sm_scale: float,
    num_draft_tokens: int,
    mask_indptr: torch.Tensor | None = None,
    page_size: int = 64,
    k_scale: float | torch.Tensor | None = None,
    o: torch.Tensor | None = None,
    backend: str = "auto",
    status: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree-masked MLA verify attention on the buffers of SGLang's FlashMLA backend (64-row
    pages); returns o `[T, H * 512]`.

    - q: `[bs * n, H * 576]`, `[bs * n, H, 576]` or `[bs, n, H, 576]`, n = `num_draft_tokens`
      (that backend's fixed verify window: every request has n drafts);
    - k_buffer: the layer's key buffer `[S, 1, 576]` (read as pages of `page_size` rows, as
      SGLang's `paged_view` does; S a multiple of it) or pages `[num_pages, page_size, (1,) 576]`;
      bf16/fp16, or FP8 (float8_e4m3fn or its uint8 bytes) with `k_scale` (`layer.k_scale`);
    - block_table: `forward_metadata.block_kv_indices[:bs]`, int32 page ids;
    - cache_seqlens: `[bs]` int32, prefix + n (SGLang: `seq_lens + num_draft_tokens`);
    - custom_mask: the FULL mask, request b's block `[n, cache_seqlens[b]]` row-major (the
      EAGLE verify input's); mask_indptr its starts, by default the exclusive sum of
      n * cache_seqlens[b] (computed on the device).
    Errors and the status name these arguments, as `target_verify_forward`'s do.
    """
    if q.dim() == 4:
        q = q.reshape(-1, q.shape[2], q.shape[3])
    q = _heads_view(q)
    batch = cache_seqlens.shape[0]
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1 or q.shape[0] != batch * num_draft_tokens:
        raise ValueError(f"ddtree_op: argument 'num_draft_tokens' must be the drafts of every request, q's "
                         f"{q.shape[0]} rows over the {batch} requests of cache_seqlens, got {num_draft_tokens!r}")
    pages = k_buffer
    if k_buffer.dim() == 3 and k_buffer.shape[1] == 1:  # a token pool [S, 1, 576]: its pages, as SGLang views them
        if k_buffer.shape[0] % page_size:
            raise ValueError(f"ddtree_op: argument 'k_buffer' must hold whole pages of {page_size} rows, "
                             f"got {k_buffer.shape[0]} rows")
        pages = k_buffer.view(-1, page_size, 1, k_buffer.shape[-1])
    qo_indptr = torch.arange(batch + 1, device=q.device, dtype=torch.int32) * num_draft_tokens
    if mask_indptr is None:
        blocks = cache_seqlens.to(torch.int64) * num_draft_tokens
        mask_indptr = torch.cat([blocks.new_zeros(1), torch.cumsum(blocks, 0)])
    o, out = _output(q, o)
    with _adapter_names():
        mla_tree_verify_paged(q, pages, block_table=block_table, cache_seqlens=cache_seqlens, qo_indptr=qo_indptr,
                              tree_mask=custom_mask, mask_indptr=mask_indptr, sm_scale=sm_scale, mask_layout="full",
                              out=out, kv_scale=k_scale, max_draft_len=num_draft_tokens, backend=backend, status=status)
    return o


def _output(q: torch.Tensor, o: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o `[T, H * 512]`, given or new, and its `[T, H, 512]` view) for q `[T, H, 576]`."""
    tokens, heads = q.shape[0], q.shape[1]
    if o is None:
        o = q.new_empty((tokens, heads * LATENT_DIM))
    elif tuple(o.shape) != (tokens, heads * LATENT_DIM) or not o.is_contiguous() or o.dtype != q.dtype:
        raise ValueError(f"ddtree_op: argument 'o' must be a contiguous {q.dtype} tensor of shape {(tokens, heads * LATENT_DIM)}, "
                         f"got {o.dtype} {tuple(o.shape)}")
    return o, o.view(tokens, heads, LATENT_DIM)


def _heads_view(q: torch.Tensor) -> torch.Tensor:
    """q as [T, H, 576] (SGLang passes [T, H * 576] or [T, H, 576])."""
    if q.dim() not in (2, 3) or (q.dim() == 2 and q.shape[-1] % QK_DIM):
        raise ValueError(f"ddtree_op: argument 'q' must be [T, H*{QK_DIM}] or [T, H, {QK_DIM}], got shape {tuple(q.shape)}")
    return q.view(q.shape[0], -1, QK_DIM) if q.dim() == 2 else q


@contextlib.contextmanager
def _adapter_names():
    """Errors of the op inside, raised again naming this adapter's arguments (ARGUMENT_NAMES)."""
    try:
        yield
    except (ValueError, RuntimeError) as error:
        renamed = rename_arguments(str(error), ARGUMENT_NAMES)
        if renamed == str(error):
            raise
        raise type(error)(renamed) from None
