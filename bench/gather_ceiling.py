"""How fast a GPU reads KV rows by slot, apart from any attention: the ceiling of the verify
kernels' gather. A read-only Triton kernel loads every key's row (one 64-row tile a program, 16-byte
loads) and keeps only a checksum, so the bytes it moves are the rows' alone. It times e4m3 rows
(576 bytes) and bf16 rows (1152 bytes) at three slot layouts: the bench's (a random permutation,
ddtree_op.synthetic), pages of 64 consecutive slots in random order (bench.paged_fp8's layout) and
one contiguous run. Its ratio e4m3 / bf16 at a layout is the best an FP8 cache can do against the
bf16 one there, whatever the kernel. The rows must outgrow the L2 for the rate to be DRAM's (a case
whose e4m3 rows fit twice in it is flagged):

  python -m bench.gather_ceiling H16_n1_B32_P8192,H16_n1_B32_P4096
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

ROW_BYTES = {"e4m3": 576, "bf16": 1152}
PAGE = 64
TILE_ROWS = 64


@triton.jit
def _gather_checksum(pool, slots, sums, num_keys, ROW_WORDS: tl.constexpr, WORDS_POW2: tl.constexpr,
                     TILE: tl.constexpr):
    tile = tl.program_id(0)
    keys = tile * TILE + tl.arange(0, TILE)
    key_ok = keys < num_keys
    slot = tl.load(slots + keys, mask=key_ok, other=0).to(tl.int64)
    words = tl.arange(0, WORDS_POW2)
    rows = tl.load(pool + slot[:, None] * ROW_WORDS + words[None, :],
                   mask=key_ok[:, None] & (words[None, :] < ROW_WORDS), other=0)
    tl.store(sums + tile, tl.sum(tl.sum(rows, axis=1), axis=0))


def slot_layouts(num_keys: int, num_slots: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Slot ids (int64, on the host) of num_keys keys in each layout, over a pool of num_slots rows."""
    pages = (num_keys + PAGE - 1) // PAGE
    page_order = torch.randperm(num_slots // PAGE, generator=generator)[:pages]
    paged = (page_order[:, None] * PAGE + torch.arange(PAGE)[None, :]).flatten()[:num_keys]
    return {
        "random": torch.randperm(num_slots, generator=generator)[:num_keys],
        "pages": paged,
        "contiguous": torch.arange(num_keys),
    }


def time_gather(pool_words: torch.Tensor, slots: torch.Tensor) -> float:
    """Seconds one gather of `slots`' rows from pool_words ([S, words] int32) takes."""
    from bench.verify import time_graph

    row_words = pool_words.shape[1]
    sums = torch.empty(triton.cdiv(slots.numel(), TILE_ROWS), dtype=torch.int32, device=pool_words.device)
    grid = (sums.numel(),)
    launch = lambda: _gather_checksum[grid](pool_words, slots, sums, slots.numel(), ROW_WORDS=row_words,  # noqa: E731
                                             WORDS_POW2=triton.next_power_of_2(row_words), TILE=TILE_ROWS, num_warps=8)
    return time_graph([launch])


def main(argv=None) -> None:
    from bench.cases import case_named
    from bench.verify import L2_BYTES

    names = (argv if argv is not None else sys.argv[1:]) or ["H16_n1_B32_P8192"]
    generator = torch.Generator().manual_seed(0)
    print(f"{'case':24s} {'layout':10s} " + " ".join(f"{k + ' GB/s':>11s}" for k in ROW_BYTES) + "  e4m3/bf16 time")
    for name in ",".join(names).split(","):
        case = case_named(name)
        num_keys = sum(p + n for p, n in zip(case.prefix_lens, case.draft_lens))
        if num_keys * ROW_BYTES["e4m3"] < 2 * L2_BYTES:
            print(f"{name}: its e4m3 rows ({num_keys * ROW_BYTES['e4m3'] / 2**20:.0f} MiB) are under twice the L2: "
                  "partly L2's rate", flush=True)
        num_slots = (num_keys + 64 + PAGE - 1) // PAGE * PAGE  # as ddtree_op.synthetic's pool: a few spare slots
        layouts = slot_layouts(num_keys, num_slots, generator)
        seconds = {}
        for kind, row_bytes in ROW_BYTES.items():
            pool = torch.randint(0, 1000, (num_slots, row_bytes // 4), dtype=torch.int32, device="cuda")  # sums stay in int32
            for layout, slots in layouts.items():
                seconds[kind, layout] = time_gather(pool, slots.to(device="cuda", dtype=torch.int32))
            del pool
        for layout in layouts:
            rates = " ".join(f"{num_keys * ROW_BYTES[k] / seconds[k, layout] / 1e9:11.0f}" for k in ROW_BYTES)
            print(f"{name:24s} {layout:10s} {rates}  {seconds['e4m3', layout] / seconds['bf16', layout]:.3f}", flush=True)


if __name__ == "__main__":
    main()
