"""The sm_90a kernel's persistent schedule: which CTA attends to which keys of which row block,
and where partials go. The preparation writes it on the device as a plan (cutlass_kernels/
verify_plan.cuh; its CPU twin prep.verify_plan) that the kernel (cutlass_kernels/sm90/
tile_scheduler.cuh, merge.cuh) reads; this is its reference in
Python (tests/test_persistent_schedule.py), and the host's shape-only choice of the kernel.

A row block has `units` of work, a unit being 128 keys (a pair of 64-key tiles). With G CTAs and
`splits` key splits per row block (the split schedule's count, from shapes), the device picks:
- pieces: piece p = (row block p // splits, split p % splits) as in the split schedule; CTA c
  takes pieces c, c + G, ... With splits > 1 piece p writes partial slot p.
- equal shares: items (row block, unit) in request, row-block, unit order; CTA i < G' = min(G, W)
  takes items [i W // G', (i + 1) W // G'). A row block cut by a CTA boundary is written as
  partials: slot 2 i when it is CTA i's first segment, else 2 i + 1.
  Lane by lane where every request has the same R row blocks, the batch has at most
  LANE_SHARES_MAX_BATCH requests and R P >= LANE_SHARES_MIN_USE / 8 of the CTAs: the items in
  row-block-within-request, request, unit order (lane j is row block j of every request, U units
  long), and G' = R P with P = min(G // R, U). Then the CTAs j P + p of every lane j take the same
  units of the same requests, so the R row blocks of a request read each key at about the same
  time (from L2 once it is there), as pieces of one split do; in request order the CTAs sweep one
  request's keys from different places at once.
Equal shares when the longest piece times the waves of pieces exceeds a CTA's share by more than
what cutting costs (CUT_COST_UNITS), that is when requests are unequal; and when there are more
pieces with splits than partial slots (2 per CTA).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...contract import CUT_COST_UNITS, LANE_SHARES_MAX_BATCH, LANE_SHARES_MIN_USE, ROWS_PER_BLOCK, UNIT_KEYS

# CUT_COST_UNITS: what an equal share pays over its units, in units: its cut row blocks' second
# prologue and fp32 epilogue, the merge, and cache misses of CTAs that are no longer in step
# (measured: docs/kernel-log.md, v8).
# The persistent kernel is used where the split schedule has one CTA per row block (splits = 1),
# in one or two waves: there the longest request sets the time. With more waves the hardware's
# CTA scheduler balances well, and with splits its pieces are already short. It also needs
# large shares: below 30 units per CTA the cuts cost more than balancing saves, and on equal
# requests (pieces) it runs behind the split kernel (docs/kernel-log.md).
MAX_WAVES = 2
MIN_UNITS_PER_CTA = 30


def work_of_requests(qo_indptr: list[int], verify_indptr: list[int], heads: int) -> list[tuple[int, int]]:
    """(row blocks, units) of each request."""
    work = []
    for b in range(len(qo_indptr) - 1):
        rows = (qo_indptr[b + 1] - qo_indptr[b]) * heads
        keys = verify_indptr[b + 1] - verify_indptr[b]
        work.append((-(-rows // ROWS_PER_BLOCK), -(-keys // UNIT_KEYS)))
    return work


def split_units(units: int, splits: int, split: int) -> tuple[int, int]:
    """Units [begin, end) of a split, as the split schedule cuts keys: equal shares rounded up to
    whole units (so the last splits can be empty)."""
    chunk = -(-units // splits)
    begin = min(units, split * chunk)
    return begin, min(units, begin + chunk)


def choose_equal_shares(work: list[tuple[int, int]], ctas: int, splits: int) -> bool:
    total = sum(blocks * units for blocks, units in work)
    if total == 0:
        return False
    pieces = sum(blocks for blocks, _ in work) * splits
    longest = max(-(-units // splits) for blocks, units in work if blocks)
    share = -(-total // min(ctas, total))
    pieces_fit = splits == 1 or pieces <= 2 * ctas  # with splits, piece p writes slot p of 2 per CTA
    return not pieces_fit or share + CUT_COST_UNITS < -(-pieces // ctas) * longest


def share_lanes(work: list[tuple[int, int]], ctas: int) -> tuple[int, int]:
    """Equal shares' (lanes, CTAs used): (R, R P) lane by lane (the module's docstring), else
    (0, min(G, W))."""
    total = sum(blocks * units for blocks, units in work)
    ungrouped = (0, min(ctas, total))
    if not work or len(work) > LANE_SHARES_MAX_BATCH or len({blocks for blocks, _ in work}) != 1:
        return ungrouped
    lanes = work[0][0]
    if lanes < 1:
        return ungrouped
    parts = min(ctas // lanes, total // lanes)
    if parts < 1 or 8 * lanes * parts < LANE_SHARES_MIN_USE * ctas:
        return ungrouped
    return lanes, lanes * parts


def row_block_order(work: list[tuple[int, int]], lanes: int) -> list[tuple[int, int, int]]:
    """The row blocks (request, block, units) in item order: request-major, or lane by lane."""
    if lanes:
        return [(b, j, units) for j in range(lanes) for b, (_, units) in enumerate(work)]
    return [(b, j, units) for b, (row_blocks, units) in enumerate(work) for j in range(row_blocks)]


@dataclass(frozen=True)
class Segment:
    request: int
    block: int  # row block within the request
    unit_begin: int
    unit_end: int  # may equal unit_begin: an empty split, which still writes its partial
    slot: int | None  # partial slot, or None: the whole row block, written to out/lse directly


def plan(qo_indptr: list[int], verify_indptr: list[int], heads: int, ctas: int, splits: int) -> tuple[bool, list[list[Segment]]]:
    """(equal shares?, each CTA's segments in item order). The kernel processes a CTA's first
    segment last when a boundary cuts it, so that CTAs start their whole row blocks in step."""
    work = work_of_requests(qo_indptr, verify_indptr, heads)
    blocks = row_block_order(work, 0)
    result: list[list[Segment]] = [[] for _ in range(ctas)]
    if not choose_equal_shares(work, ctas, splits):
        for piece in range(len(blocks) * splits):
            b, j, units = blocks[piece // splits]
            begin, end = split_units(units, splits, piece % splits)
            result[piece % ctas].append(Segment(b, j, begin, end, piece if splits > 1 else None))
        return False, result
    lanes, used = share_lanes(work, ctas)
    total = sum(units for _, _, units in blocks)
    offset = 0  # first item of the current row block
    for b, j, units in row_block_order(work, lanes):
        for cta in range(used):
            begin, end = cta * total // used, (cta + 1) * total // used
            lo, hi = max(begin, offset), min(end, offset + units)
            if lo >= hi:
                continue
            whole = lo == offset and hi == offset + units
            slot = None if whole else 2 * cta + (0 if lo == begin else 1)
            result[cta].append(Segment(b, j, lo - offset, hi - offset, slot))
        offset += units
    return True, result


def slots_of_row_block(qo_indptr: list[int], verify_indptr: list[int], heads: int, ctas: int, splits: int,
                       request: int, block: int) -> list[int]:
    """The partial slots of one row block in unit order, as the kernel's merge finds them from
    formulas (tile_scheduler.cuh's partial_slots); [] when one CTA wrote the whole row block."""
    work = work_of_requests(qo_indptr, verify_indptr, heads)
    if not choose_equal_shares(work, ctas, splits):
        index = sum(row_blocks for row_blocks, _ in work[:request]) + block
        return list(range(index * splits, (index + 1) * splits)) if splits > 1 else []
    total = sum(row_blocks * units for row_blocks, units in work)
    lanes, used = share_lanes(work, ctas)
    if lanes:
        first = block * (total // lanes) + sum(units for _, units in work[:request])
    else:
        first = sum(row_blocks * units for row_blocks, units in work[:request]) + block * work[request][1]
    last = first + work[request][1] - 1

    def cta_of(item: int) -> int:  # the last CTA whose share begins at or before `item`
        return ((item + 1) * used - 1) // total

    i0, i1 = cta_of(first), cta_of(last)
    if i0 == i1:
        return []
    return [2 * i0 + (0 if i0 * total // used == first else 1)] + [2 * i for i in range(i0 + 1, i1 + 1)]


def row_blocks_and_units(num_tokens: int, heads: int, batch: int, num_keys_bound: int) -> tuple[int, int]:
    """From shapes: the row blocks, and the units of all the work with every request at the mean length."""
    row_blocks = -(-num_tokens * heads // ROWS_PER_BLOCK)
    return row_blocks, row_blocks * -(-num_keys_bound // (UNIT_KEYS * max(batch, 1)))


def use_persistent(num_tokens: int, heads: int, batch: int, num_keys_bound: int, ctas: int, splits: int) -> bool:
    """Shape-only choice of the persistent kernel: more than one request (one cannot be unequal),
    one split per row block, at most MAX_WAVES waves of them, and at least MIN_UNITS_PER_CTA units
    per CTA."""
    row_blocks, units = row_blocks_and_units(num_tokens, heads, batch, num_keys_bound)
    return batch > 1 and splits == 1 and row_blocks <= MAX_WAVES * ctas and units >= MIN_UNITS_PER_CTA * ctas
