"""The sm_90a split kernel's schedule: its key splits per row block from shapes only, and the
pieces that the preparation cuts the batch into on the device (cutlass_kernels/verify_plan.cuh
writes them into the plan; `split_pieces` is their reference in Python).

Pieces: a batch of equal requests gets `splits` pieces per row block, as the shapes say. In a
ragged batch a long request's row blocks get more pieces and a short one's fewer, so that no
piece is longer than it must be: every row block of `units` units (pairs of key tiles) is cut
into max(1, ceil(units / c)) nearly equal pieces, c the fewest units for which all pieces fit the
budget (the shapes' row blocks times `splits`, at most one wave of CTAs, or the row blocks where
they are more) and no row block has more than PIECE_SLOTS_PER_SPLIT * splits pieces. CTA p of the
split kernel attends piece p, and the pieces go longest first in a batch of at most
LONGEST_FIRST_MAX_BATCH requests: requests by their longest piece, descending (ties in request
order), a request's row blocks in order and a row block's pieces together. The hardware
dispatches CTAs in order, so the long pieces start in the first wave and the short ones fill in
behind them (bench/schedule_model.py; a larger batch keeps request order).

With splits, piece k of a row block writes partial rows [k, row] ([PIECE_SLOTS_PER_SPLIT * splits,
T * H, 512]) and its first piece an LSE of -inf in the slots past its last, so the split combine
(lse_merge.combine_splits) reads the first `splits` slots of a row with their LSEs and a slot past
them only where its LSE is live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...contract import (LONGEST_FIRST_MAX_BATCH, MAX_PIECE_BUDGET, PIECE_SLOTS_PER_SPLIT, ROWS_PER_BLOCK, SM90_MAX_SPLITS,
                         UNIT_KEYS, plan_capacity)
from ..splits import resident_splits


def num_kv_splits_whole_tiles(num_tokens: int, heads: int, batch: int, num_keys_bound: int, sms: int, block_m: int,
                              ctas_per_sm: int, keys_per_split: int, max_splits: int) -> int:
    """For a kernel whose splits hold whole multiples of keys_per_split keys (the sm_90a kernel's
    pairs of tiles): one split per keys_per_split keys of the mean request, rounded up (P + n keys
    with n small would otherwise leave each split two units and half the splits empty), as many
    as fit the GPU's resident CTAs, at most max_splits."""
    keys_per_request = num_keys_bound / max(batch, 1)
    by_length = max(1, math.ceil(keys_per_request / keys_per_split))
    return max(1, min(resident_splits(num_tokens, heads, sms, block_m, ctas_per_sm), by_length, max_splits))


CTAS_PER_SM = 1  # 216 KB of shared memory per CTA


def plan_shape(sms: int, num_tokens: int, heads: int, batch: int, num_keys_bound: int) -> tuple[int, int]:
    """(CTAs, splits) of the kernels on a GPU of `sms` SMs: what the preparation makes the
    schedule plan for, and what attention.py launches unless told otherwise."""
    ctas = sms * CTAS_PER_SM
    return ctas, sm90_splits(num_tokens, heads, batch, num_keys_bound, ctas)


def sm90_splits(num_tokens: int, heads: int, batch: int, num_keys_bound: int, ctas: int) -> int:
    """The split kernel's key splits per row block over `ctas` CTAs: whole units (pairs of 64-key
    tiles). Short splits pay off: one CTA's fixed cost (index loads, first copies, epilogue) is a
    few microseconds, and partials of 64 rows are small."""
    return num_kv_splits_whole_tiles(num_tokens, heads, batch, num_keys_bound, ctas, ROWS_PER_BLOCK, CTAS_PER_SM,
                                     UNIT_KEYS, SM90_MAX_SPLITS)


@dataclass(frozen=True)
class Piece:
    request: int
    block: int  # row block within the request
    unit_begin: int
    unit_end: int
    slot: int | None  # partial slot (its index among its row block's pieces), or None (one split): out/lse directly
    pieces: int  # of its row block


# The e4m3 kernel `auto` takes (fp8_kernel): the transposed one where a request's row block has at
# most TRANSPOSED_MAX_ROWS rows (its GEMMs' N <= 32), or where a piece has at least
# TRANSPOSED_MIN_PIECE_KEYS keys (at N = 64 its fixed cost a piece is higher than the widened
# kernel's). Measured on an H100 (kernel log, thirty-first session, after q's rows were
# bulk-copied ahead of the tiles), FP8 / bf16 step, transposed against widened: 0.67 against 1.14
# at 16 rows; at 64 rows or more 1.18 against 1.71 with 4098 keys a piece, 1.085 against 1.134
# with 512, 1.16 against 1.105 with 257.
TRANSPOSED_MAX_ROWS = 32
TRANSPOSED_MIN_PIECE_KEYS = 512


def fp8_kernel_for_shapes(num_tokens: int, heads: int, batch: int, num_keys_bound: int, splits: int) -> str:
    """"transposed" or "widened" for an e4m3 cache, from shapes only (a request's rows and keys
    taken as the batch's mean)."""
    batch = max(batch, 1)
    rows = num_tokens * heads / batch
    piece_keys = num_keys_bound / batch / max(splits, 1)
    return "transposed" if rows <= TRANSPOSED_MAX_ROWS or piece_keys >= TRANSPOSED_MIN_PIECE_KEYS else "widened"


def _pieces_of(units: int, piece_units: int) -> int:
    return -(-units // piece_units) if units > piece_units else 1


def split_piece_units(work: list[tuple[int, int]], capacity: int, batch: int, ctas: int, splits: int) -> int | None:
    """c of the module docstring for (row blocks, units) per request; None: nothing is cut."""
    if splits <= 1:
        return None
    rows = sum(blocks for blocks, _ in work)
    budget = max(rows, min(max(capacity - batch, 0) * splits, ctas, MAX_PIECE_BUDGET))
    longest = max((units for blocks, units in work if blocks), default=0)
    c = max(1, -(-sum(blocks * units for blocks, units in work) // budget) if budget else 1,
            -(-longest // (PIECE_SLOTS_PER_SPLIT * splits)))
    while sum(blocks * _pieces_of(units, c) for blocks, units in work) > budget and c < longest:
        c += 1
    return c


def split_pieces(qo_indptr: list[int], verify_indptr: list[int], heads: int, num_rows: int, ctas: int,
                 splits: int) -> list[Piece]:
    """The split kernel's pieces in CTA order (the reference of the plan's piece arrays)."""
    from .persistent_schedule import work_of_requests

    work = work_of_requests(qo_indptr, verify_indptr, heads)
    batch = len(work)
    c = split_piece_units(work, plan_capacity(num_rows, heads, batch), batch, ctas, splits)
    requests = []
    for b, (row_blocks, units) in enumerate(work):
        n = 1 if c is None else _pieces_of(units, c)
        q, r = divmod(units, n)
        mine = []
        for j in range(row_blocks):
            for k in range(n):
                begin = k * q + min(k, r)
                mine.append(Piece(b, j, begin, begin + q + (k < r), k if splits > 1 else None, n))
        requests.append(mine)
    if batch <= LONGEST_FIRST_MAX_BATCH:  # stable: equal longest pieces keep request order
        requests.sort(key=lambda mine: -max((p.unit_end - p.unit_begin for p in mine), default=0))
    return [piece for mine in requests for piece in mine]
