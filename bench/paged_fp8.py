"""Paged and FP8 inputs for a bench case (the bench scripts wire them in beside the slot-list
inputs): the same step as `Case` describes, in FlashMLA's paged layout and/or with an FP8 e4m3
cache, plus the byte count the FP8 floor is measured against. `python -m bench.paged_fp8
[CASE,...] [BACKEND]` times the whole step in the four variants on a GPU (main's docstring: the
other tables)."""

from __future__ import annotations

import contextlib
import os

import torch

from ddtree_op.synthetic_paged import PagedBatch, make_paged_batch

FP8_KV_ROW_BYTES = 576  # one e4m3 latent+rope row
PAGE_SIZE = 64  # FlashMLA's page size: the fast path


def paged_inputs(case, *, kv_dtype: str = "same", page_size: int = PAGE_SIZE, layout: str = "full",
                 device: str = "cuda", seed: int = 0, kv_scale: float = 0.05) -> PagedBatch:
    """A paged verify step for `case` (a bench.cases.Case): kv_dtype "same" (bf16), "fp8" or
    "uint8" (e4m3 bytes); kv_scale as a device tensor, as a serving engine would hold it.
    Call `ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs())`."""
    return make_paged_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, page_size=page_size,
                            kv_dtype=kv_dtype, kv_scale=kv_scale if kv_dtype != "same" else None,
                            kv_scale_tensor=kv_dtype != "same", layout=layout, chain=case.chain, device=device, seed=seed,
                            extra_pages=0, extra_columns=0)


def fp8_slot_inputs(vb, *, kv_scale: float = 0.05):
    """The slot-list batch `vb` (ddtree_op.synthetic.VerifyBatch) with its cache in e4m3 and the
    kv_scale tensor: `mla_tree_verify(vb.q, cache, **vb.kwargs(), kv_scale=scale)`."""
    from ddtree_op.synthetic_paged import fp8_cache

    cache = fp8_cache(vb.kv_cache.float(), kv_scale)
    return cache, torch.tensor([kv_scale], dtype=torch.float32, device=cache.device)


def fp8_bytes(case) -> float:
    """Bytes of the step with an FP8 cache: case.bytes() with e4m3 KV rows."""
    from bench.cases import KV_ROW_BYTES

    keys = sum(p + n for p, n in zip(case.prefix_lens, case.draft_lens))
    return case.bytes() - keys * (KV_ROW_BYTES - FP8_KV_ROW_BYTES)


def step_launches(case, variant: str, backend: str = "auto", seed: int = 0):
    """A launch (a no-argument callable) of the whole verify step of `case` in one of the
    variants "slot", "slot_fp8", "paged", "paged_fp8", with static out/lse buffers."""
    import ddtree_op
    from ddtree_op.synthetic import make_verify_batch

    max_draft = max(case.draft_lens)
    if variant.startswith("paged"):
        pb = paged_inputs(case, kv_dtype="fp8" if variant.endswith("fp8") else "same", seed=seed)
        out = torch.empty(pb.q.shape[0], case.heads, 512, dtype=pb.q.dtype, device="cuda")
        lse = torch.empty(pb.q.shape[0], case.heads, device="cuda")
        return lambda: ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=out, lse=lse, backend=backend,
                                                       max_draft_len=max_draft)
    vb = make_verify_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, device="cuda", seed=seed,
                           chain=case.chain, kv_cache_3d=True)
    cache, scale = (fp8_slot_inputs(vb) if variant.endswith("fp8") else (vb.kv_cache, None))
    out = torch.empty(vb.q.shape[0], case.heads, 512, dtype=vb.q.dtype, device="cuda")
    lse = torch.empty(vb.q.shape[0], case.heads, device="cuda")
    return lambda: ddtree_op.mla_tree_verify(vb.q, cache, **vb.kwargs(), out=out, lse=lse, backend=backend,
                                             max_draft_len=max_draft, kv_scale=scale)


VARIANTS = ("slot", "paged", "slot_fp8", "paged_fp8")


def fp8_layer_inputs(case, seed: int):
    """bench/verify.py's input set of `case` with its cache in e4m3 and the kv_scale tensor, which
    its layers (Inputs.attend_over) pass on."""
    from bench.verify import Inputs

    inputs = Inputs(case, seed)
    inputs.vb.kv_cache, inputs.kv_scale = fp8_slot_inputs(inputs.vb)
    return inputs


def layer_launches(case, fp8: bool, backend: str = "auto") -> list:
    """A model forward's launches per input set (bench/verify.py's forward_launches: one preparation,
    then a layer a launch) with the bf16 cache or the e4m3 one."""
    from bench.verify import Inputs, forward_launches, input_set_count

    make = fp8_layer_inputs if fp8 else Inputs
    return forward_launches([make(case, seed) for seed in range(input_set_count(case))], backend)


def time_step(case, variant: str, backend: str = "auto") -> float:
    """Seconds a step of `variant` (step_launches) takes, over the case's rotating input sets."""
    from bench.verify import input_set_count, time_graph

    return time_graph([step_launches(case, variant, backend, seed) for seed in range(input_set_count(case))])


@contextlib.contextmanager
def sm90_fp8_kernel(kernel: str):
    """DDTREE_SM90_FP8_KERNEL = kernel within the block (read when a step is captured), then as it was."""
    before = os.environ.get("DDTREE_SM90_FP8_KERNEL")
    os.environ["DDTREE_SM90_FP8_KERNEL"] = kernel
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DDTREE_SM90_FP8_KERNEL", None)
        else:
            os.environ["DDTREE_SM90_FP8_KERNEL"] = before


def timed_variants(case, backend: str, fp8_kernels: list[str]) -> dict[str, float]:
    """Seconds a step of each variant, the FP8 ones once per sm90 FP8 kernel (named "slot_fp8/K"),
    all in this run."""
    times = {v: time_step(case, v, backend) for v in VARIANTS[:2]}
    for kernel in fp8_kernels:
        with sm90_fp8_kernel(kernel):
            for v in VARIANTS[2:]:
                times[f"{v}/{kernel}"] = time_step(case, v, backend)
    return times


def print_variants(cases, backend: str, kernels: list[str]) -> None:
    """The whole step per case in the four variants, the FP8 ones with each sm90 FP8 kernel."""
    columns = list(VARIANTS[:2]) + [f"{v}/{k}" for k in kernels for v in VARIANTS[2:]]
    print(f"{'case':28s} " + " ".join(f"{c:>20s}" for c in columns) + "   fp8/bf16 (slot, paged) per kernel")
    for case in cases:
        times = timed_variants(case, backend, kernels)
        ratios = "  ".join(f"{k}: {times[f'slot_fp8/{k}'] / times['slot']:.3f} {times[f'paged_fp8/{k}'] / times['paged']:.3f}"
                           for k in kernels)
        print(f"{case.name:28s} " + " ".join(f"{times[c] * 1e6:18.1f}us" for c in columns) + f"   {ratios}", flush=True)


def print_steps(cases, backend: str, triton_too: bool) -> None:
    """The whole step per case with the bf16 and the e4m3 cache (slot layout; the sm90 FP8 kernel as
    DDTREE_SM90_FP8_KERNEL says), and with triton_too the Triton kernel's FP8 step beside them."""
    for case in cases:
        t = {v: time_step(case, v, backend) for v in ("slot", "slot_fp8")}
        line = (f"{case.name:28s} bf16 {t['slot'] * 1e6:8.1f}us  fp8 {t['slot_fp8'] * 1e6:8.1f}us  "
                f"fp8/bf16 {t['slot_fp8'] / t['slot']:.3f}")
        if triton_too:
            triton = time_step(case, "slot_fp8", "triton")
            line += f"  triton fp8 {triton * 1e6:8.1f}us ({triton / t['slot']:.3f} of sm90 bf16)"
        print(line, flush=True)


def print_per_layer(cases, backend: str, kernels: list[str]) -> None:
    """A model forward's time per layer (layer_launches) with the bf16 cache and with the e4m3 cache
    under each sm90 FP8 kernel, one after another in one process."""
    from bench.verify import time_graph

    print(f"{'case':28s} {'bf16/layer':>12s} " + " ".join(f"{'fp8/' + k:>14s}" for k in kernels) + "   fp8/bf16 per kernel")
    for case in cases:
        bf16 = time_graph(layer_launches(case, False, backend))
        fp8 = {}
        for kernel in kernels:
            with sm90_fp8_kernel(kernel):  # read when the graph is captured
                fp8[kernel] = time_graph(layer_launches(case, True, backend))
        print(f"{case.name:28s} {bf16 * 1e6:10.1f}us " + " ".join(f"{fp8[k] * 1e6:12.1f}us" for k in kernels)
              + "   " + "  ".join(f"{k}: {fp8[k] / bf16:.3f}" for k in kernels), flush=True)


def main(argv=None) -> None:
    """Times the whole verify step (CUDA-graph replays over rotating input sets, as bench/verify.py)
    on a GPU. `python -m bench.paged_fp8 [CASE,CASE,...] [BACKEND] [KERNEL,KERNEL,...]` (cases:
    bench.cases.case_named; kernels: "auto", "transposed", "widened"; default "auto"): per case the
    four variants, the FP8 ones with each sm90 FP8 kernel. `--steps`: the slot layout's bf16 and
    FP8 steps only (`--triton` adds Triton's FP8 step). `--per-layer`: a forward's time per layer."""
    import argparse

    from bench.cases import all_cases, case_named

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("cases", nargs="?", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("backend", nargs="?", default="auto")
    parser.add_argument("kernels", nargs="?", default="auto", help="comma-separated sm90 FP8 kernels")
    table = parser.add_mutually_exclusive_group()
    table.add_argument("--steps", action="store_true")
    table.add_argument("--per-layer", action="store_true")
    parser.add_argument("--triton", action="store_true", help="with --steps: Triton's FP8 step too")
    args = parser.parse_args(argv)
    cases = [case_named(name) for name in args.cases.split(",")] if args.cases else all_cases()
    kernels = args.kernels.split(",")
    if args.steps:
        print_steps(cases, args.backend, args.triton)
    elif args.per_layer:
        print_per_layer(cases, args.backend, kernels)
    else:
        print_variants(cases, args.backend, kernels)


if __name__ == "__main__":
    main()
