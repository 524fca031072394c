"""The sm_90a kernel's balanced schedule: which CTA attends to which keys of which row block, and
where the cut row blocks' partials go. The kernel (cutlass_kernels/sm90/balanced_plan.cuh) and the
combine (balanced_combine.py) compute it on the device from the indptrs; this is their reference
in Python, and the host's shape-only choice between it and the split schedule.

Items are (row block, unit) pairs, a unit being 128 keys (a pair of 64-key tiles), ordered by
request, row block, unit. With W items and G CTAs, CTA i < min(G, W) takes items
[i W // G', (i + 1) W // G') with G' = min(G, W). A row block cut by CTA boundaries is written as
fp32 partials: into slot 2 i by CTA i when it is that CTA's first segment, else into 2 i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

ROWS_PER_BLOCK = 64
UNIT_KEYS = 128
# The balanced schedule pays a second prologue and a partial epilogue (~15 K cycles, about 1.6
# units) in every CTA whose share crosses a row block; it is chosen only where a CTA's share
# is large enough for that to be small next to what balancing saves (measured: kernel notes).
MIN_UNITS_PER_CTA = 12


def work_of_requests(qo_indptr: list[int], verify_indptr: list[int], heads: int) -> list[tuple[int, int]]:
    """(row blocks, units) of each request."""
    work = []
    for b in range(len(qo_indptr) - 1):
        rows = (qo_indptr[b + 1] - qo_indptr[b]) * heads
        keys = verify_indptr[b + 1] - verify_indptr[b]
        work.append((-(-rows // ROWS_PER_BLOCK), -(-keys // UNIT_KEYS)))
    return work


@dataclass(frozen=True)
class Segment:
    request: int
    block: int  # row block within the request
    unit_begin: int
    unit_end: int
    slot: int | None  # partial slot, or None: the whole row block, written to out/lse directly


def plan(qo_indptr: list[int], verify_indptr: list[int], heads: int, ctas: int) -> list[list[Segment]]:
    """Each CTA's segments, in order."""
    blocks = [(b, j, units) for b, (row_blocks, units) in enumerate(work_of_requests(qo_indptr, verify_indptr, heads))
              for j in range(row_blocks)]
    total = sum(units for _, _, units in blocks)
    used = min(ctas, total)
    result: list[list[Segment]] = [[] for _ in range(ctas)]
    offset = 0  # first item of the current row block
    for b, j, units in blocks:
        for cta in range(used):
            begin, end = cta * total // used, (cta + 1) * total // used
            lo, hi = max(begin, offset), min(end, offset + units)
            if lo >= hi:
                continue
            whole = lo == offset and hi == offset + units
            slot = None if whole else 2 * cta + (0 if lo == begin else 1)
            result[cta].append(Segment(b, j, lo - offset, hi - offset, slot))
        offset += units
    return result


def slots_of_row_block(qo_indptr: list[int], verify_indptr: list[int], heads: int, ctas: int, request: int,
                       block: int) -> list[int]:
    """The partial slots of one row block in unit order, as the combine finds them from
    formulas; [] when one CTA wrote the whole row block."""
    work = work_of_requests(qo_indptr, verify_indptr, heads)
    total = sum(row_blocks * units for row_blocks, units in work)
    used = min(ctas, total)
    first = sum(row_blocks * units for row_blocks, units in work[:request]) + block * work[request][1]
    last = first + work[request][1] - 1

    def cta_of(item: int) -> int:  # the last CTA whose share begins at or before `item`
        return ((item + 1) * used - 1) // total

    i0, i1 = cta_of(first), cta_of(last)
    if i0 == i1:
        return []
    return [2 * i0 + (0 if i0 * total // used == first else 1)] + [2 * i for i in range(i0 + 1, i1 + 1)]


def use_balanced(num_tokens: int, heads: int, batch: int, num_keys_bound: int, ctas: int) -> bool:
    """Shape-only choice: the balanced schedule when the mean share of a CTA is at least
    MIN_UNITS_PER_CTA units (estimated with every request at the mean length)."""
    row_blocks = -(-num_tokens * heads // ROWS_PER_BLOCK)
    units_per_request = -(-num_keys_bound // (UNIT_KEYS * max(batch, 1)))
    return row_blocks * units_per_request >= MIN_UNITS_PER_CTA * ctas
