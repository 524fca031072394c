"""Benchmark shapes and their speed-of-light floors (pure Python: unit-tested on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

KV_ROW_BYTES = 576 * 2  # one bf16 latent+rope row, read once per request
INDEX_BYTES = 4  # one int32 slot id per key
Q_ROW_BYTES = 576 * 2
OUT_ROW_BYTES = 512 * 2 + 4  # bf16 output + float32 lse


@dataclass(frozen=True)
class Case:
    name: str
    heads: int
    prefix_lens: tuple[int, ...]
    draft_lens: tuple[int, ...]
    chain: bool = False
    tags: tuple[str, ...] = field(default=())

    @property
    def batch(self) -> int:
        return len(self.prefix_lens)

    def indptrs(self) -> tuple[list[int], list[int]]:
        """(qo_indptr, verify_indptr) as lists: each request's drafts, and its prefix + drafts keys."""
        qo = [0, *accumulate(self.draft_lens)]
        kv = [0, *accumulate(p + n for p, n in zip(self.prefix_lens, self.draft_lens))]
        return qo, kv

    def flops(self) -> float:
        """QK^T over 576 and PV over 512 for every (draft row, head, key) pair, masked or not."""
        return sum(2.0 * (576 + 512) * self.heads * n * (p + n) for p, n in zip(self.prefix_lens, self.draft_lens))

    def bytes(self) -> float:
        keys = sum(p + n for p, n in zip(self.prefix_lens, self.draft_lens))
        rows = sum(self.draft_lens) * self.heads
        return keys * (KV_ROW_BYTES + INDEX_BYTES) + rows * (Q_ROW_BYTES + OUT_ROW_BYTES)

    def floor_seconds(self, peak_flops: float, peak_bytes_per_s: float) -> float:
        return max(self.flops() / peak_flops, self.bytes() / peak_bytes_per_s)


def ragged(prefix: int, batch: int) -> tuple[int, ...]:
    """Prefix lengths varying x3 within the batch with the same total as `batch * prefix`."""
    if batch == 1:
        return (prefix,)
    lo = prefix / 2
    lens = [lo + (3 * lo - lo) * i / (batch - 1) for i in range(batch)]  # lo .. 3*lo, mean 2*lo = prefix
    out = [int(round(x)) for x in lens]
    out[-1] += batch * prefix - sum(out)
    return tuple(out)


def grid_cases() -> list[Case]:
    """The benchmark grid: H in {16,128}, n in {4,16,64}, B in {1,8,32}, P in {1k,8k}, less
    the one shape too large to be a realistic verify step (H=128, n=64, B=32, P=8k)."""
    cases = []
    for heads in (16, 128):
        for n in (4, 16, 64):
            for batch in (1, 8, 32):
                for prefix in (1024, 8192):
                    if heads == 128 and n == 64 and batch == 32 and prefix == 8192:
                        continue
                    cases.append(Case(f"H{heads}_n{n}_B{batch}_P{prefix}", heads, (prefix,) * batch, (n,) * batch, tags=("grid",)))
    return cases


def ragged_cases() -> list[Case]:
    return [
        Case(c.name + "_ragged", c.heads, ragged(c.prefix_lens[0], c.batch), c.draft_lens, tags=("ragged",))
        for c in grid_cases()
        if c.batch > 1
    ]


def ragged_pair_cases() -> list[Case]:
    """Each ragged case beside the uniform grid case of the same total work (issue 14's 10%)."""
    uniform = {c.name: c for c in grid_cases()}
    return [case for r in ragged_cases() for case in (uniform[r.name[: -len("_ragged")]], r)]


def serving_cases() -> list[Case]:
    """DeepSeek-V3 serving points: TP8 (16 heads) and a 128-head shard; chain and trees."""
    out = []
    for heads in (16, 128):
        out.append(Case(f"dsv3_H{heads}_chain4_B64_P4k", heads, (4096,) * 64, (4,) * 64, chain=True, tags=("serving",)))
        out.append(Case(f"dsv3_H{heads}_tree16_B16_P16k", heads, (16384,) * 16, (16,) * 16, tags=("serving",)))
        out.append(Case(f"dsv3_H{heads}_tree64_B4_P32k", heads, (32768,) * 4, (64,) * 4, tags=("serving",)))
        out.append(Case(f"dsv3_H{heads}_tree16_B1_P32k", heads, (32768,), (16,), tags=("serving",)))
    return out


def all_cases() -> list[Case]:
    return grid_cases() + ragged_cases() + serving_cases()


def case_named(name: str) -> Case:
    """A case of all_cases() by its name, or a uniform batch named H<heads>_n<drafts>_B<batch>_P<prefix>
    (shapes off the grid, such as q_len 1 and 2)."""
    import re

    known = {case.name: case for case in all_cases()}
    if name in known:
        return known[name]
    match = re.fullmatch(r"H(\d+)_n(\d+)_B(\d+)_P(\d+)", name)
    if not match:
        raise ValueError(f"case {name!r}: not a bench case, nor H<heads>_n<drafts>_B<batch>_P<prefix>")
    heads, drafts, batch, prefix = (int(x) for x in match.groups())
    return Case(name, heads, (prefix,) * batch, (drafts,) * batch)


def geomean(values: list[float]) -> float:
    import math

    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
