"""The transposed FP8 pair loop alone (bench/probes/transposed_fp8_pair.cu), against a float32
reference and beside the package's bf16 and FP8 kernels on the same shapes, in one process:

  python3 -m bench.transposed_fp8_probe [--shapes H16_n1_B32_P8192,...] [--splits 4] [--variants bf16,f16cvt]
                                         (on the GPU machine)

A shape H{h}_n{q}_B{b}_P{p} is b requests of h q rows over p cached keys each; a CTA takes N = h q
rows of a request up to 64 (16, 32 at H = 16 with q_len 1, 2), blocks of 64 beyond (the H = 128
shapes: the compute-bound side, where issue 17 asks for no slower than bf16). The probe sees
every key (no tree mask) and splits each request's keys into `splits` equal ranges, one CTA each;
its partial outputs are merged here (not timed). The package's columns are the attention alone
over a prepared step (bench.verify's `--no-prep` column: the split kernel and its merge), on the
same shape with q drafts (p + q keys).

Each variant (VARIANTS: the probe's builds, by their macros) is its own extension; PROBE_ROWS=16
(32, 64) in the environment builds that N alone. The timing-only ablations (nowiden, nogemm)
compute wrong outputs, so their errors are not checked.

Printed per shape and variant: the probe's relative error (fp32 reference on the dequantised cache)
and its ranges' largest log-sum-exp error (base 2); its CTAs' mean clock cycles a pair and, of
those, warpgroup 0's waits for a tile to land, at the softmax's named barriers, for its GEMMs to
retire and for an A buffer's last GEMM group (one untimed run); times (CUDA-graph replays); the
ratios probe / package FP8 and probe / package bf16 (the FP8 target: <= 0.6x bf16 on the
memory-bound shapes, issue 17); and the probe's bytes (e4m3 rows, slot ids, q, its fp32 partial
outputs) per second as a fraction of the device's copy rate (bench.verify's ceiling, measured in
the same run)."""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

import torch

from bench.cases import Case

SOURCE = Path(__file__).resolve().parent / "probes" / "transposed_fp8_pair.cu"
KV_SCALE = 0.05
# q's scale: logits of standard deviation ~1.2 (e4m3 values ~N(0, 3^2) times KV_SCALE, 576 columns,
# sm_scale 576^-0.5), so that the softmax is far from uniform and a wrong logit shows in the output.
Q_SCALE = 8.0
LSE_TOLERANCE = 0.05  # base 2: the probe's per-range log-sum-exp against the reference's
SHAPES = "H16_n1_B32_P8192,H16_n2_B32_P8192,H16_n4_B32_P8192,H16_n4_B8_P8192,H128_n1_B8_P8192,H128_n4_B8_P8192"
# The probe's builds: their macros (PROBE_VARIANT: the Variant enum of its source; PROBE_A_BUFFERS,
# PROBE_SLOT_PREFETCH, PROBE_BUFFER_CLOCK: the source's defaults are 4, 1 and 1).
VARIANTS = {
    "bf16": ["PROBE_VARIANT=0"],
    "nowiden": ["PROBE_VARIANT=1"],
    "nogemm": ["PROBE_VARIANT=2"],
    "f16cvt": ["PROBE_VARIANT=3"],
    "f16cvt_2buf": ["PROBE_VARIANT=3", "PROBE_A_BUFFERS=2"],
    # 99296c8's f16cvt, to compare against in the same run
    "f16cvt_2buf_noprefetch": ["PROBE_VARIANT=3", "PROBE_A_BUFFERS=2", "PROBE_SLOT_PREFETCH=0", "PROBE_BUFFER_CLOCK=0"],
}
TIMING_ONLY = {"nowiden", "nogemm"}
CLOCK_KINDS = 5  # the source's ClockKind: pair, land wait, barrier wait, GEMM wait, A-buffer wait


def load_probe(variant: str = "bf16"):
    from torch.utils.cpp_extension import load

    from ddtree_op.build import cuda_build_flags, include_dirs

    flags = cuda_build_flags()
    macros = VARIANTS[variant] + ([f"PROBE_ROWS={rows}"] if (rows := os.environ.get("PROBE_ROWS")) else [])
    return load(name=f"transposed_fp8_pair_{variant}", sources=[str(SOURCE)],
                extra_cuda_cflags=[*flags["nvcc"], *(f"-D{macro}" for macro in macros)],
                extra_cflags=flags["cxx"], extra_include_paths=include_dirs("sm90"), verbose=False)


def parse_shape(name: str) -> tuple[int, int, int, int]:
    match = re.fullmatch(r"H(\d+)_n(\d+)_B(\d+)_P(\d+)", name)
    if not match:
        raise ValueError(f"shape {name!r}: expected H<heads>_n<q_len>_B<batch>_P<prefix>")
    return tuple(int(x) for x in match.groups())  # type: ignore[return-value]


def probe_inputs(heads: int, q_len: int, batch: int, keys: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = heads * q_len
    q = (torch.randn(batch * rows, 576, device="cuda", generator=gen) * Q_SCALE).to(torch.bfloat16)
    pool = batch * keys + 1000
    e4m3 = (torch.randn(pool, 576, device="cuda", generator=gen) * 3).to(torch.float8_e4m3fn)
    slots = torch.randperm(pool, device="cuda", generator=gen)[: batch * keys].view(batch, keys).int().contiguous()
    return q, e4m3, slots


def reference(q, e4m3, slots, rows: int, sm_scale: float, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 attention of each request's rows over its keys, on the dequantised cache, and each
    key range's base-2 log-sum-exp ([splits, batch * rows], the probe's `lse`)."""
    out = torch.empty(q.shape[0], 512, device="cuda")
    lse = torch.empty(splits, q.shape[0], device="cuda")
    for b in range(slots.shape[0]):
        kv = e4m3[slots[b].long()].float() * KV_SCALE
        s = (q[b * rows:(b + 1) * rows].float() @ kv.T) * sm_scale
        out[b * rows:(b + 1) * rows] = torch.softmax(s, dim=-1) @ kv[:, :512]
        lse[:, b * rows:(b + 1) * rows] = torch.stack([torch.logsumexp(part, -1) for part in s.chunk(splits, dim=-1)])
    return out, lse / math.log(2.0)


def merge(out_parts: torch.Tensor, lse_parts: torch.Tensor) -> torch.Tensor:
    """The splits' normalised outputs [splits, rows, 512] weighted by their base-2 log-sum-exps."""
    weights = torch.softmax(lse_parts * math.log(2.0), dim=0)
    return (weights.unsqueeze(-1) * out_parts).sum(0)


def package_launches(heads: int, q_len: int, batch: int, prefix: int):
    """The package's attention alone (bf16 cache, then the same cache in e4m3) on the shape."""
    from bench.paged_fp8 import fp8_slot_inputs
    from bench.verify import Inputs
    from ddtree_op import mla_tree_verify_prepared

    inputs = Inputs(Case(f"H{heads}_n{q_len}_B{batch}_P{prefix}", heads, (prefix,) * batch, (q_len,) * batch), seed=0)
    cache, scale = fp8_slot_inputs(inputs.vb, kv_scale=KV_SCALE)
    vb = inputs.vb

    def fp8():
        mla_tree_verify_prepared(vb.q, cache, inputs.prepared, sm_scale=vb.sm_scale, out=inputs.out, lse=inputs.lse,
                                 kv_scale=scale, backend="sm90")

    return inputs.attention("sm90"), fp8


def probe_bytes(rows: int, batch: int, keys: int, splits: int) -> int:
    """What the probe reads and writes: e4m3 rows and slot ids, q once a CTA, fp32 outputs and lse."""
    return batch * keys * (576 + 4) + splits * batch * rows * (576 * 2 + 512 * 4 + 4)


def main(argv=None) -> int:
    from bench.verify import measure_ceilings, time_graph

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--splits", default="auto", help="ranges a request's keys are split into (auto: ~132 CTAs)")
    parser.add_argument("--variants", default="bf16", help=f"the probe's builds, of {','.join(VARIANTS)}")
    parser.add_argument("--no-package", action="store_true", help="the probe alone: no package kernels timed beside it")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(unknown)}; known: {','.join(VARIANTS)}")
    probes = {variant: load_probe(variant) for variant in variants}
    copy_rate = measure_ceilings()["copy_bytes_per_s"]
    print(f"{torch.cuda.get_device_name()}, copy {copy_rate / 1e12:.2f} TB/s")
    print(f"{'shape':22s} {'variant':>22s} {'splits':>6s} {'rel err':>9s} {'lse err':>8s} {'cyc/pair':>8s} {'land':>6s} "
          f"{'barr':>6s} {'gemm':>6s} {'buf':>6s} {'probe':>9s} {'pkg fp8':>9s} {'pkg bf16':>9s} "
          f"{'probe/fp8':>9s} {'probe/bf16':>10s} {'fp8/bf16':>8s} {'probe/copy':>10s}")
    failed = False
    for name in args.shapes.split(","):
        heads, q_len, batch, prefix = parse_shape(name)
        rows, keys = heads * q_len, prefix
        blocks = rows // min(rows, 64)
        splits = max(1, 132 // (batch * blocks)) if args.splits == "auto" else int(args.splits)
        while keys % (splits * 128):
            splits -= 1
        sm_scale = 576 ** -0.5
        q, e4m3, slots = probe_inputs(heads, q_len, batch, keys, seed=1)
        ref, ref_lse = reference(q, e4m3, slots, rows, sm_scale, splits)
        if args.no_package:
            bf16_s = fp8_s = math.nan
        else:
            bf16, fp8 = package_launches(heads, q_len, batch, prefix)
            bf16_s, fp8_s = time_graph([bf16]), time_graph([fp8])
        for variant, probe in probes.items():
            out = torch.full((splits, batch * rows, 512), float("nan"), device="cuda")  # poisoned
            lse = torch.full((splits, batch * rows), float("nan"), device="cuda")
            no_cycles = torch.empty(0, device="cuda")
            run = lambda: probe.run(q, e4m3.view(torch.uint8), slots, out, lse, no_cycles, sm_scale, KV_SCALE,  # noqa: E731
                                    rows, splits)
            cycles = torch.zeros(splits, batch * blocks, CLOCK_KINDS, device="cuda")
            probe.run(q, e4m3.view(torch.uint8), slots, out, lse, cycles, sm_scale, KV_SCALE, rows, splits)
            torch.cuda.synchronize()
            if variant in TIMING_ONLY:
                checked = f"{'-':>9s} {'-':>8s} "
            else:
                err = ((merge(out, lse) - ref).norm() / ref.norm()).item()
                lse_err = (lse - ref_lse).abs().max().item()
                ok = math.isfinite(err) and err <= 2e-2 and math.isfinite(lse_err) and lse_err <= LSE_TOLERANCE
                failed |= not ok
                checked = f"{err:9.2e} {lse_err:8.1e}{' ' if ok else '!'}"
            pair, land, barrier, gemm, buffer = cycles.view(-1, CLOCK_KINDS).mean(0).tolist()
            print(f"{name:22s} {variant:>22s} {splits:6d} {checked}{pair:8.0f} {land:6.0f} {barrier:6.0f} {gemm:6.0f} "
                  f"{buffer:6.0f}",
                  end="", flush=True)  # kept if the timing dies
            probe_s = time_graph([run])
            print(f" {probe_s * 1e6:7.1f}us {fp8_s * 1e6:7.1f}us {bf16_s * 1e6:7.1f}us {probe_s / fp8_s:9.3f} "
                  f"{probe_s / bf16_s:10.3f} {fp8_s / bf16_s:8.3f} "
                  f"{probe_bytes(rows, batch, keys, splits) / probe_s / copy_rate:10.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
