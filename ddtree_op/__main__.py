"""Demo: one DeepSeek-V3-shaped verify step through ddtree_op.mla_tree_verify.

The step is built the way SGLang builds it (random trees, FULL masks with the prefix columns set,
slots scattered over a larger pool), run eagerly, under torch.compile(fullgraph=True) and, on a
GPU, replayed from a captured CUDA graph with a new batch written into the same buffers. Each
path is checked and timed per step. On a GPU the CUDA kernels are checked against the float32
reference; on a CPU, where the float32 reference is what runs, against an independent float64
brute force written here from SGLang's buffers.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from . import mla_tree_verify
from .contract import BACKEND_CHOICES, LATENT_DIM
from .synthetic import make_verify_batch

PROG = "python -m ddtree_op"
TOLERANCE = 2e-2  # relative Frobenius error; bf16 inputs and outputs


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message; argparse's exit status
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> Parser:
    gpu = torch.cuda.is_available()
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="Defaults marked 'CPU | GPU' depend on --device. Exit status: 0 when every path "
                      "matches, 1 when one does not, 2 for a bad argument.")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help=f"where to run (default: cuda where a GPU is visible, else cpu; here: {'cuda' if gpu else 'cpu'})")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention backend (default: auto = sm90 on compute capability 9.0, triton on other GPUs, "
                        "the reference on a CPU)")
    p.add_argument("--heads", type=positive_int, default=16,
                   help="query heads of this GPU's shard (default: 16, DeepSeek-V3 at tensor parallelism 8)")
    p.add_argument("--q-len", type=positive_int, default=16, help="draft tokens per request (default: 16)")
    p.add_argument("--batch", type=positive_int, default=None, help="requests per step (default: CPU 2 | GPU 8)")
    p.add_argument("--prefix", type=positive_int, default=None,
                   help="mean cached prefix length; each request's is drawn from [prefix/2, 3*prefix/2] "
                        "(default: CPU 256 | GPU 4096)")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="q and KV dtype (default: bfloat16)")
    p.add_argument("--iters", type=positive_int, default=None, help="timed steps per path (default: CPU 3 | GPU 50)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda was asked for, but no CUDA device is visible")
    if args.device == "cpu" and args.backend not in ("auto", "reference"):
        parser.error(f"argument --backend: {args.backend} needs --device cuda; on a CPU only the reference runs")
    gpu = args.device == "cuda"
    args.batch = args.batch or (8 if gpu else 2)
    args.prefix = args.prefix or (4096 if gpu else 256)
    args.iters = args.iters or (50 if gpu else 3)
    args.parser = parser
    return args


def backend_that_runs(args) -> str:
    if args.device == "cpu":
        return "reference"
    if args.backend != "auto":
        return args.backend
    from .backends import auto_cuda_backend

    return auto_cuda_backend(torch.device("cuda"))


def brute_force(vb) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out, lse) straight from SGLang's buffers, per request: gather the prefix and draft
    rows by slot id, take draft visibility from the FULL mask's draft columns, softmax. It shares
    nothing with ddtree_op's preparation ops or reference."""
    q = vb.q.double().cpu()
    kv = vb.kv_cache.double().cpu().reshape(vb.kv_cache.shape[0], -1)
    qo, kvp, mask_at = vb.qo_indptr.tolist(), vb.kv_indptr.tolist(), vb.mask_indptr.tolist()
    kv_indices, out_cache_loc, mask = vb.kv_indices.cpu().long(), vb.out_cache_loc.cpu().long(), vb.tree_mask.cpu()
    out = torch.zeros(q.shape[0], q.shape[1], LATENT_DIM, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    for b in range(len(qo) - 1):
        n, P = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        if n == 0:
            continue
        keys = kv[torch.cat([kv_indices[kvp[b] : kvp[b + 1]], out_cache_loc[qo[b] : qo[b + 1]]])]
        block = mask[mask_at[b] : mask_at[b] + n * (P + n)].view(n, P + n).bool()
        visible = torch.cat([torch.ones(n, P, dtype=torch.bool), block[:, P:]], dim=1)  # every draft sees the prefix
        scores = torch.einsum("thd,kd->thk", q[qo[b] : qo[b + 1]], keys) * vb.sm_scale
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        weights = torch.nan_to_num(torch.exp(scores - row_lse[..., None]))  # rows that see nothing: 0
        out[qo[b] : qo[b + 1]] = weights @ keys[:, :LATENT_DIM]
        lse[qo[b] : qo[b + 1]] = row_lse
    return out, lse


def relative_error(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def per_step_ms(fn, device: str, iters: int) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) * 1e3 / iters


def make_batch(args, prefix, seed):
    return make_verify_batch(prefix, [args.q_len] * args.batch, args.heads, dtype=getattr(torch, args.dtype),
                             device=args.device, seed=seed, pad_rows=2)


def run(args) -> int:
    gen = torch.Generator().manual_seed(0)
    prefix = [int(x) for x in torch.randint(args.prefix // 2, args.prefix * 3 // 2 + 1, (args.batch,), generator=gen)]
    vb = make_batch(args, prefix, seed=0)
    gpu = args.device == "cuda"
    ran = backend_that_runs(args)

    def expected(batch):
        if gpu:
            return mla_tree_verify(batch.q, batch.kv_cache, **batch.kwargs(), backend="reference")
        return brute_force(batch)

    baseline = "float32 reference (backend='reference')" if gpu else "independent float64 brute force"
    rows = []

    def check(name, out, lse, want, ms):
        err = relative_error(out, want[0])
        ok = err < TOLERANCE and not torch.isnan(out).any() and torch.equal(torch.isinf(lse).cpu(), torch.isinf(want[1]).cpu())
        rows.append((name, err, ms, ok))

    want = expected(vb)

    def eager():
        return mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend=args.backend)

    out, lse = eager()  # the first call may JIT-build the CUDA libraries (a notice says so)
    check("eager", out, lse, want, per_step_ms(eager, args.device, args.iters))

    def step(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr):
        return mla_tree_verify(q, kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               out_cache_loc=out_cache_loc, tree_mask=tree_mask, mask_indptr=mask_indptr,
                               sm_scale=vb.sm_scale, backend=args.backend)

    compiled = torch.compile(step, fullgraph=True)
    inputs = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)
    out, lse = compiled(*inputs)
    check("torch.compile(fullgraph=True)", out, lse, want, per_step_ms(lambda: compiled(*inputs), args.device, args.iters))

    if gpu:
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
        check("CUDA graph replay, new batch", graph_out, graph_lse, expected(new), per_step_ms(graph.replay, "cuda", args.iters))

    name = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"ddtree_op verify step on {args.device} ({name}): H={args.heads}, q_len={args.q_len}, B={args.batch}, "
          f"prefix ~{args.prefix}, {args.dtype}, sm_scale {vb.sm_scale}")
    print(f"backend: {ran}" + (" (backend='auto')" if args.backend == "auto" else "") + f"; compared with: {baseline}")
    print(f"{'path':32s} {'rel. error':>10s} {'time per step':>14s}  result (tolerance {TOLERANCE:.0e})")
    for path, err, ms, ok in rows:
        print(f"{path:32s} {err:10.2e} {ms:11.3f} ms  {'ok' if ok else 'FAIL'}")
    print(f"times: mean of {args.iters} steps after a warm-up step" + ("" if gpu else "; on a CPU the reference is a "
                                                                        "loop over requests, not a fast path"))
    return 0 if all(ok for *_, ok in rows) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ValueError, RuntimeError) as exc:
        # The op's own refusals (an argument combination it does not take, a missing header) start
        # with "ddtree_op:" and are one line; anything else is a bug and keeps its traceback.
        message = str(exc)
        if not message.startswith("ddtree_op:"):
            raise
        args.parser.error(message.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
