"""SGLang's own Triton extend-attention kernel (`extend_attention_fwd`, what `TritonAttnBackend`
runs for MLA TARGET_VERIFY), from the installed sglang package, with the calling convention of
bench/sglang_baseline.py. Importable only where `sglang.kernels.ops.attention.extend_attention`
imports (`available()` says whether, and why not).

The backend hands the kernel the drafts' own K/V rows (`k_extend`, `v_extend`: the projection
outputs, contiguous) beside the pool; here they are gathered from the cache at `out_cache_loc`
once, when a callable is built (`make_sglang_triton_extend`), so the timed call is the kernel
alone, as in a server.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _extend_attention_fwd():
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    return extend_attention_fwd


def available() -> tuple[bool, str]:
    """(True, sglang version) where SGLang's extend kernel imports, else (False, the reason)."""
    try:
        _extend_attention_fwd()
        import sglang

        return True, sglang.__version__
    except Exception as exc:  # a missing dependency of sglang names itself here
        return False, f"{type(exc).__name__}: {exc}"


def sglang_triton_extend_verify(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, sm_scale,
                                max_draft_len, out, k_extend=None):
    """out[t, h] from SGLang's extend kernel on FULL-mask verify inputs (`q` [T, H, 576],
    `kv_cache` [S, 1, 576] or [S, 576], `out` [T, H, 512]). `k_extend` [T, 1, 576]: the drafts'
    rows, gathered from the cache when not given."""
    k_buffer = kv_cache if kv_cache.dim() == 3 else kv_cache.unsqueeze(1)
    if k_extend is None:
        k_extend = k_buffer[out_cache_loc]
    _extend_attention_fwd()(
        q, k_extend, k_extend[..., :512], out, k_buffer, k_buffer[..., :512], qo_indptr, kv_indptr, kv_indices,
        tree_mask, True, mask_indptr, max_draft_len, 1.0, 1.0, sm_scale,
    )
    return out


def make_sglang_triton_extend(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, sm_scale,
                              max_draft_len, out):
    """A zero-argument callable for the timing loop (the drafts' rows gathered once, here)."""
    k_buffer = kv_cache if kv_cache.dim() == 3 else kv_cache.unsqueeze(1)
    k_extend = k_buffer[out_cache_loc].contiguous()
    return lambda: sglang_triton_extend_verify(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr,
                                               sm_scale, max_draft_len, out, k_extend=k_extend)
