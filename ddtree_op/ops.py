"""The custom ops in `torch.ops.ddtree`: schemas, CPU/CUDA implementations, fake implementations.

Schemas are defined from Python so that the ops, their CPU reference and their fakes exist on a
CPU-only install with no compiled library. Backends are chosen in `backends/__init__.py`.
"""

from __future__ import annotations

import torch

from . import backends, build, meta, prep, status as status_layout
from .contract import LATENT_DIM
from .checks import check_status_argument

_lib = torch.library.Library("ddtree", "DEF")  # module-level: the ops live as long as this

_lib.define(
    "build_verify_indices(Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc)"
    " -> (Tensor verify_indptr, Tensor verify_indices)"
)
_lib.define(
    "convert_tree_mask(Tensor tree_mask, Tensor? mask_indptr, Tensor qo_indptr, Tensor kv_indptr,"
    " str layout, SymInt num_rows, SymInt words_per_row) -> Tensor"
)
_lib.define(
    "prepare_verify(Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc, Tensor tree_mask,"
    " Tensor? mask_indptr, str layout, SymInt num_rows, SymInt words_per_row, SymInt num_slots=2147483647,"
    " int max_draft_len=0, Tensor(a!)? status=None, Tensor(b!)? plan=None, SymInt heads=0, bool publish_status=True)"
    " -> (Tensor verify_indptr, Tensor verify_indices, Tensor mask_words, Tensor qo_indptr_out)"
)
# `status` (status.py) records the faults of the index values. With publish_status=False they are
# left in its workspace for the attention op that follows (given the same status) to publish:
# the verify step's way, which spares the preparation's blocks a ticket (cutlass_kernels/status.cuh).
# `plan` (int64 [contract.plan_numel(num_rows, heads, B)]), when given, receives the sm90 kernels'
# schedule plan of the sanitized batch (cutlass_kernels/verify_plan.cuh), made for the CTAs and
# splits that backend chooses from these shapes on this device.
# Paged KV: the block table as slot lists (prep.paged_slot_lists), which prepare_verify then checks.
_lib.define(
    "paged_slot_lists(Tensor block_table, Tensor cache_seqlens, Tensor qo_indptr, SymInt page_size, SymInt num_pages,"
    " SymInt num_rows) -> (Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc)"
)
_ATTENTION_ARGS = (
    "Tensor q, Tensor kv_cache, Tensor qo_indptr, Tensor verify_indptr, Tensor verify_indices,"
    " Tensor mask_words, float sm_scale"
)
# An FP8 (float8_e4m3fn) kv_cache is dequantized by kv_scale (float32 [1], read on the device) or
# else by kv_scale_value; other caches ignore both.
_SCALE_ARGS = "Tensor? kv_scale=None, float kv_scale_value=1.0"
# `plan`: prepare_verify's, read by the sm90 backend (which makes one where it is not given).
# `status`: publishes what the prepare_verify before it (publish_status=False) left in it.
_lib.define(f"tree_attention({_ATTENTION_ARGS}, str backend='auto', {_SCALE_ARGS}, Tensor? plan=None,"
            " Tensor(a!)? status=None) -> (Tensor out, Tensor lse)")
_lib.define(f"tree_attention_into({_ATTENTION_ARGS}, Tensor(a!) out, Tensor(b!) lse, str backend='auto', {_SCALE_ARGS},"
            " Tensor? plan=None, Tensor(c!)? status=None) -> ()")


def _build_verify_indices_cuda(qo_indptr, kv_indptr, kv_indices, out_cache_loc):
    # One scan + one gather kernel from the compiled library (JIT-built on first use).
    build.load_cuda_library()
    return torch.ops.ddtree_cuda.build_verify_indices(
        qo_indptr.contiguous(), kv_indptr.contiguous(), kv_indices.contiguous(), out_cache_loc.contiguous()
    )


def _convert_tree_mask_cuda(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row):
    # One fused launch from the compiled library instead of ~15 tensor ops.
    build.load_cuda_library()
    return torch.ops.ddtree_cuda.convert_tree_mask(
        tree_mask.contiguous(), None if mask_indptr is None else mask_indptr.contiguous(), qo_indptr.contiguous(),
        kv_indptr.contiguous(), layout, num_rows, words_per_row,
    )


def _plan_schedule(plan, qo_indptr, kv_indices, out_cache_loc, num_rows, heads):
    """(CTAs, splits) that the plan is made for: the sm90 backend's, from shapes."""
    if plan is None:
        return 1, 1
    if heads < 1:
        raise ValueError(f"ddtree_op: prepare_verify writes a plan for heads >= 1 (the heads of q), got heads={heads}")
    return backends.plan_schedule(qo_indptr.device, num_rows, heads, qo_indptr.numel() - 1,
                                  kv_indices.numel() + out_cache_loc.numel())


def _prepare_verify_cpu(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows, words_per_row,
                        num_slots=prep.CLAMP_HIGH, max_draft_len=0, status=None, plan=None, heads=0, publish_status=True):
    if status is not None:
        check_status_argument(status, qo_indptr.device)  # as the CUDA op checks it
    ctas, splits = _plan_schedule(plan, qo_indptr, kv_indices, out_cache_loc, num_rows, heads)
    return prep.prepare_verify_checked(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows,
                                       words_per_row, num_slots, max_draft_len, status, plan, heads, ctas, splits,
                                       publish_status)


def _prepare_verify_cuda(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout, num_rows, words_per_row,
                         num_slots=prep.CLAMP_HIGH, max_draft_len=0, status=None, plan=None, heads=0, publish_status=True):
    # Both preparation steps, the checks, the status and the schedule plan in one launch.
    if status is not None:
        check_status_argument(status, qo_indptr.device)  # a ValueError before the CUDA op's own check
    build.load_cuda_library()
    ctas, splits = _plan_schedule(plan, qo_indptr, kv_indices, out_cache_loc, num_rows, heads)
    return torch.ops.ddtree_cuda.prepare_verify(
        qo_indptr.contiguous(), kv_indptr.contiguous(), kv_indices.contiguous(), out_cache_loc.contiguous(),
        tree_mask.contiguous(), None if mask_indptr is None else mask_indptr.contiguous(), layout, num_rows, words_per_row,
        num_slots, max_draft_len, status, plan, heads, ctas, splits, publish_status,
    )


def _paged_slot_lists_cuda(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    # One launch: each block scans the lengths into shared memory, then writes slots (cutlass_kernels/paged_indices.cu).
    build.load_cuda_library()
    table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    return torch.ops.ddtree_cuda.paged_slot_lists(table, cache_seqlens.contiguous(), qo_indptr.contiguous(), page_size,
                                                  num_pages, num_rows)


_lib.impl("build_verify_indices", prep.build_verify_indices, "CPU")
_lib.impl("build_verify_indices", _build_verify_indices_cuda, "CUDA")
_lib.impl("convert_tree_mask", prep.convert_tree_mask, "CPU")
_lib.impl("convert_tree_mask", _convert_tree_mask_cuda, "CUDA")
_lib.impl("prepare_verify", _prepare_verify_cpu, "CPU")
_lib.impl("prepare_verify", _prepare_verify_cuda, "CUDA")
_lib.impl("paged_slot_lists", prep.paged_slot_lists, "CPU")
_lib.impl("paged_slot_lists", _paged_slot_lists_cuda, "CUDA")


def _tree_attention_into(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend="auto",
                         kv_scale=None, kv_scale_value=1.0, plan=None, status=None):
    if status is not None:
        check_status_argument(status, q.device)
    published = backends.run_tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out,
                                            lse, backend, kv_scale, kv_scale_value, plan, status)
    if status is not None and not published:  # no kernel launched that publishes it (CPU, reference, no rows)
        status_layout.publish(status)


def _tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, backend="auto", kv_scale=None,
                    kv_scale_value=1.0, plan=None, status=None):
    out = q.new_empty((q.shape[0], q.shape[1], LATENT_DIM))
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    _tree_attention_into(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend,
                         kv_scale, kv_scale_value, plan, status)
    return out, lse


for _key in ("CPU", "CUDA"):
    _lib.impl("tree_attention", _tree_attention, _key)
    _lib.impl("tree_attention_into", _tree_attention_into, _key)


def _inference_only(name: str):
    """An Autograd kernel that raises where a backward would be needed (instead of PyTorch's
    warning and an output without grad_fn) and otherwise passes the call on. Only the attention
    ops need it: the preparation ops take integer tensors, which never require grad. It runs on
    eager calls with grad mode on (a few microseconds); torch.inference_mode() skips it."""
    redispatch = getattr(torch.ops.ddtree, name).default.redispatch
    after_autograd = torch._C._after_autograd_keyset

    def kernel(keyset, q, kv_cache, *rest):
        if (q.requires_grad or kv_cache.requires_grad) and torch.is_grad_enabled():
            raise RuntimeError(f"ddtree_op: torch.ops.ddtree.{name} is inference-only (it has no backward); call it under "
                               "torch.no_grad() or torch.inference_mode(), or detach q and kv_cache")
        return redispatch(keyset & after_autograd, q, kv_cache, *rest)

    return kernel


for _name in ("tree_attention", "tree_attention_into"):
    _lib.impl(_name, _inference_only(_name), "Autograd", with_keyset=True)

torch.library.register_fake("ddtree::build_verify_indices", meta.build_verify_indices_fake, lib=_lib)
torch.library.register_fake("ddtree::convert_tree_mask", meta.convert_tree_mask_fake, lib=_lib)
torch.library.register_fake("ddtree::prepare_verify", meta.prepare_verify_fake, lib=_lib)
torch.library.register_fake("ddtree::paged_slot_lists", meta.paged_slot_lists_fake, lib=_lib)
torch.library.register_fake("ddtree::tree_attention", meta.tree_attention_fake, lib=_lib)
torch.library.register_fake("ddtree::tree_attention_into", meta.tree_attention_into_fake, lib=_lib)

build_verify_indices = torch.ops.ddtree.build_verify_indices.default
convert_tree_mask = torch.ops.ddtree.convert_tree_mask.default
prepare_verify = torch.ops.ddtree.prepare_verify.default
paged_slot_lists = torch.ops.ddtree.paged_slot_lists.default
tree_attention = torch.ops.ddtree.tree_attention.default
tree_attention_into = torch.ops.ddtree.tree_attention_into.default
