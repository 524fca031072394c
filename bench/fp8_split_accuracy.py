"""Host-side accuracy of FP8-compute designs for an e4m3 KV cache (no GPU): the attention of one
64-row block against an e4m3 cache, computed with q and P rounded the ways an FP8 wgmma kernel
could hold them, each against the float64 reference on the same dequantized cache:

  python -m bench.fp8_split_accuracy [--seed 0]

  q:  bf16 (a bf16 S GEMM on a widened K), e4m3 with a scale per row, or the sum of two e4m3
      parts under one scale per row (hi = e4m3(q), lo = e4m3(q - hi): two FP8 S GEMMs into one
      accumulator)
  P:  bf16, e4m3 with each row's maximum at 256 (e4m3's smallest subnormal is 2^-9), or that plus
      its e4m3 residual under the same scale (two FP8 P·V GEMMs into one accumulator)

Random normal q (in bf16, as the op takes it) and KV (scaled by the spread, then rounded to e4m3
with a per-tensor scale); the reference is float64 on those same values.
Prints the relative error ||out - ref|| / ||ref|| of each pair; the op's bound is 2e-2.

  python -m bench.fp8_split_accuracy --online

models instead the sm90 FP8-compute kernel's softmax (bench/variants/f8mma.diff): q in hi + lo
under a power-of-two scale per 64-row block, 64-key tiles, a row maximum that moves only when a
tile's is `rise` above it, P = exp2(logit - max + offset) in hi + lo e4m3, fp32 accumulation
(the tensor cores' accumulation precision is not modelled), for the bf16 kernel's rule (rise 8,
offset 0) and the FP8 kernel's (rise 2, offset 6), at prefixes 4 K to 128 K.
"""

from __future__ import annotations

import argparse
import math

import torch

E4M3 = torch.float8_e4m3fn


def e4m3_tensor(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax() / 448.0
    return (x / scale).to(E4M3).float() * scale


def e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448.0
    return (x / scale).to(E4M3).float() * scale


def e4m3_pair(x: torch.Tensor) -> torch.Tensor:
    """hi + lo: hi = e4m3(x), lo = e4m3(x - hi), with no scale (two FP8 GEMMs sharing an accumulator)."""
    hi = x.to(E4M3).float()
    return hi + (x - hi).to(E4M3).float()


def e4m3_pair_rows(x: torch.Tensor) -> torch.Tensor:
    """hi + lo, both e4m3 under the same scale per row."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448.0
    return e4m3_pair(x / scale) * scale


def errors(prefix: int, spread: float, generator: torch.Generator) -> dict[str, float]:
    q_bf16 = torch.randn(64, 576, generator=generator).bfloat16().float()  # the op's q is bf16
    kv = e4m3_tensor(torch.randn(prefix, 576, generator=generator) * spread)
    scale = 1 / math.sqrt(576)
    ref = torch.softmax(q_bf16.double() @ kv.double().T * scale, -1) @ kv[:, :512].double()
    queries = {"q bf16": q_bf16, "q e4m3": e4m3_rows(q_bf16), "q e4m3 hi+lo": e4m3_pair_rows(q_bf16)}
    result = {}
    for q_name, q_used in queries.items():
        logits = q_used @ kv.T * scale
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        p_hi = (e * 256).to(E4M3).float()
        p_pair = e4m3_pair(e * 256) / 256  # both parts under the scale 256
        for p_name, p_used in (("P bf16", e.bfloat16().float()), ("P e4m3", p_hi / 256), ("P e4m3 hi+lo", p_pair)):
            out = (p_used @ kv[:, :512]) / e.sum(-1, keepdim=True)
            result[f"{q_name}, {p_name}"] = ((out.double() - ref).norm() / ref.norm()).item()
    return result


def e4m3_pair_pow2_block(x: torch.Tensor) -> torch.Tensor:
    """hi + lo e4m3 under the largest power-of-two scale that keeps the block's maximum <= 448."""
    mantissa, exponent = torch.frexp(x.abs().amax())
    scale = 2.0 ** int((9 if mantissa <= 0.875 else 8) - exponent)
    return e4m3_pair(x * scale) / scale


def online_error(prefix: int, rise: float, offset: float, generator: torch.Generator, sm_scale: float = 0.1352) -> float:
    q = torch.randn(64, 576, generator=generator).bfloat16().float()
    kv = e4m3_tensor(torch.randn(prefix, 576, generator=generator))
    ref = torch.softmax(q.double() @ kv.double().T * sm_scale, -1) @ kv[:, :512].double()
    logits = e4m3_pair_pow2_block(q) @ kv.T * (sm_scale / math.log(2))  # base 2
    row_max = torch.full((64,), -math.inf)
    out, row_sum = torch.zeros(64, 512), torch.zeros(64)
    for key in range(0, prefix, 64):
        tile = logits[:, key:key + 64]
        tile_max = tile.amax(-1)
        moves = tile_max - row_max > rise
        new_max = torch.where(moves, tile_max, row_max)
        factor = torch.nan_to_num(torch.where(moves, torch.exp2(row_max - new_max), torch.ones(64)), nan=0.0)
        row_max = new_max
        p = torch.exp2(tile - row_max[:, None] + offset)
        out = out * factor[:, None] + e4m3_pair(p) @ kv[key:key + 64, :512]
        row_sum = row_sum * factor + p.sum(-1)
    return ((out / row_sum[:, None]).double() - ref).norm().item() / ref.norm().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--online", action="store_true", help="model the FP8-compute kernel's online softmax")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    if args.online:
        print(f"{'prefix':>8}{'rise 8, offset 0':>20}{'rise 2, offset 6':>20}")
        for prefix in (4096, 32768, 131072):
            bf16_rule, fp8_rule = online_error(prefix, 8.0, 0.0, generator), online_error(prefix, 2.0, 6.0, generator)
            print(f"{prefix:>8}{bf16_rule:>20.1e}{fp8_rule:>20.1e}")
        return
    rows = [(p, s, errors(p, s, generator)) for p, s in ((1024, 1.0), (8192, 1.0), (8192, 3.0), (32768, 1.0))]
    names = list(rows[0][2])
    print(f"{'prefix, KV spread':18}" + "".join(f"{n:>27}" for n in names))
    for prefix, spread, errs in rows:
        print(f"{f'{prefix}, {spread}':18}" + "".join(f"{errs[n]:27.1e}" for n in names))


if __name__ == "__main__":
    main()
