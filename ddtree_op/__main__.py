"""Demo verify step: `python -m ddtree_op [--heads 16 --q-len 16 --batch 4 --prefix 1024 --device cuda]`.

Builds a DeepSeek-V3-shaped verify step the way SGLang does (random trees, FULL masks with the
prefix columns set, scattered slots), runs it eagerly, under torch.compile(fullgraph=True) and,
on a GPU, replayed from a captured CUDA graph with a new batch written into the same buffers;
checks each against the float32 reference and prints a table.
"""

from __future__ import annotations

import argparse
import time

import torch

from . import mla_tree_verify
from .synthetic import make_verify_batch


def relative_error(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--heads", type=int, default=16, help="heads of this GPU's shard (DeepSeek-V3 at TP8: 16)")
    p.add_argument("--q-len", type=int, default=16, help="draft tokens per request")
    p.add_argument("--batch", type=int, default=8 if cuda else 2)
    p.add_argument("--prefix", type=int, default=4096 if cuda else 256, help="mean cached prefix length")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--backend", default="auto")
    return p.parse_args(argv)


def make_batch(args, prefix, seed):
    return make_verify_batch(prefix, [args.q_len] * args.batch, args.heads, dtype=getattr(torch, args.dtype),
                             device=args.device, seed=seed, pad_rows=2)


def timed(fn, device):
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return result, (time.perf_counter() - start) * 1e3


def main(argv=None) -> int:
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    prefix = [int(x) for x in torch.randint(args.prefix // 2, args.prefix * 3 // 2 + 1, (args.batch,), generator=gen)]
    vb = make_batch(args, prefix, seed=0)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    rows = []

    def check(name, out, lse, ref_out=ref_out, ref_lse=ref_lse, ms=None):
        err = relative_error(out, ref_out)
        ok = err < 2e-2 and not torch.isnan(out).any() and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        rows.append((name, err, ms, ok))

    def eager():
        return mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend=args.backend)

    eager()  # first call may compile kernels
    (out, lse), ms = timed(eager, args.device)
    check(f"eager ({args.backend})", out, lse, ms=ms)

    def step(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr):
        return mla_tree_verify(q, kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               out_cache_loc=out_cache_loc, tree_mask=tree_mask, mask_indptr=mask_indptr,
                               sm_scale=vb.sm_scale, backend=args.backend)

    compiled = torch.compile(step, fullgraph=True)
    inputs = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)
    out, lse = compiled(*inputs)
    check("torch.compile(fullgraph=True)", out, lse)

    if args.device.startswith("cuda"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out, graph_lse = step(*inputs)
        # New lengths (shorter, rotated among requests), slots, trees and data in the same buffers.
        new = make_batch(args, [p * 3 // 4 for p in prefix[1:] + prefix[:1]], seed=1)
        for buf, value in zip(inputs, (new.q, new.kv_cache, new.qo_indptr, new.kv_indptr, new.kv_indices,
                                       new.out_cache_loc, new.tree_mask, new.mask_indptr)):
            buf.view(-1)[: value.numel()].copy_(value.reshape(-1))
        graph_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        end.synchronize()
        want_out, want_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
        check("CUDA graph replay, new batch", graph_out, graph_lse, want_out, want_lse, start.elapsed_time(end) / 10)

    print(f"verify step: device {args.device}, H={args.heads}, q_len={args.q_len}, B={args.batch}, "
          f"prefix ~{args.prefix}, {args.dtype}, sm_scale {vb.sm_scale}")
    print(f"{'path':34s} {'rel. error vs fp32 ref':>24s} {'time':>10s}  result")
    for name, err, ms, ok in rows:
        t = f"{ms:8.3f}ms" if ms is not None else " " * 10
        print(f"{name:34s} {err:24.2e} {t:>10s}  {'ok' if ok else 'FAIL'}")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
