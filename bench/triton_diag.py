"""Registers and spills of the Triton kernel per configuration: `python -m bench.triton_diag`."""

import torch

from ddtree_op import ops
from ddtree_op.synthetic import make_verify_batch
from ddtree_op.backends.triton.attention import tree_attention_triton

CONFIGS = [(64, 32, 8, 1, 1), (64, 64, 8, 1, 1), (64, 64, 8, 1, 2), (64, 32, 4, 1, 2), (32, 64, 4, 1, 1), (64, 32, 8, 2, 1)]


def main():
    vb = make_verify_batch([1024] * 8, [4] * 8, 16, device="cuda")
    vind, vidx = ops.build_verify_indices(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc)
    words = ops.convert_tree_mask(vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, "full", vb.q.shape[0], 1)
    out = torch.empty(vb.q.shape[0], 16, 512, device="cuda", dtype=vb.q.dtype)
    lse = torch.empty(vb.q.shape[0], 16, device="cuda")
    for bm, bn, w, s, dv in CONFIGS:
        try:
            kernel = tree_attention_triton(vb.q, vb.kv_cache, vb.qo_indptr, vind, vidx, words, vb.sm_scale, out, lse,
                                           block_m=bm, block_n=bn, num_warps=w, num_stages=s, dv_parts=dv, num_splits=1)
        except Exception as exc:  # e.g. OutOfResources: report and go on with the next configuration
            print(f"BM{bm} BN{bn} warps{w} stages{s} dv_parts{dv}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        print(f"BM{bm} BN{bn} warps{w} stages{s} dv_parts{dv}: regs {kernel.n_regs}, spills {kernel.n_spills}, "
              f"shared {kernel.metadata.shared} B", flush=True)


if __name__ == "__main__":
    main()
