"""A work model of the sm_90a schedules, for the ragged target (issue 14: a batch whose prefixes
vary x3 within 10% of the equal batch of the same work), on the CPU:

  PYTHONPATH=$PWD python3 -m bench.schedule_model [--sms 132] [--piece-cost 1.0] [--cut-waves W] [--request-order]

For every grid shape and its ragged twin (bench/cases.py) it takes the schedule the op would run
(shape-only kernel choice and splits; the device plan's pieces or segments, from their Python
references) and sums each SM's work in units (128 keys of one 64-row block) plus `piece-cost`
units for each piece or segment (its prologue, epilogue and launch share). Split-kernel pieces go
to SMs in CTA order, each to the SM that frees first (the hardware's greedy dispatch); the
persistent kernel's segments stay on their CTA. The makespan ratio ragged / equal is the model's
prediction of the measured time ratio; the 2026-12-05 landing run (H100) measured 1.25 and 1.26
where it predicts 1.40, and orders the shapes alike (kernel log, seventeenth session).

The split kernel's pieces go longest first (schedule.split_pieces). `--request-order` models the
order before that: requests in order, so that a batch whose long requests come last starts them
in the last wave.

`--cut-waves W` models a policy the op does not have: the split kernel's pieces cut from the
lengths alone, whatever the shapes' splits: every row block into pieces of at most c units, c no
less than the mean share of W waves of SMs, at most W waves of pieces and PIECE_SLOTS_PER_SPLIT *
max(splits, 2) pieces a row block (so partial slots for two splits at least, and a combine, on
every split-kernel shape).
"""

from __future__ import annotations

import argparse
import heapq

from bench.cases import grid_cases, ragged_cases
from ddtree_op.backends.sm90.persistent_schedule import plan, use_persistent, work_of_requests
from ddtree_op.backends.sm90.schedule import _pieces_of, plan_shape, split_pieces
from ddtree_op.contract import PIECE_SLOTS_PER_SPLIT


def greedy_makespan(costs: list[float], sms: int) -> float:
    """Pieces dispatched in order, each to the SM that frees first."""
    free = [0.0] * sms
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def cut_pieces(work: list[tuple[int, int]], sms: int, waves: int, splits: int) -> list[int]:
    """Piece lengths (units) of the modelled policy: every row block cut into pieces of at most c
    units, c the smallest that keeps the pieces within `waves` waves, no shorter than the mean
    share of `waves` waves, and at most PIECE_SLOTS_PER_SPLIT * max(splits, 2) pieces a row block."""
    longest = max(units for blocks, units in work if blocks)
    total = sum(blocks * units for blocks, units in work)
    c = max(1, -(-total // (waves * sms)), -(-longest // (PIECE_SLOTS_PER_SPLIT * max(splits, 2))))
    while sum(blocks * _pieces_of(units, c) for blocks, units in work) > waves * sms and c < longest:
        c += 1
    lengths = []
    for blocks, units in work:
        n = _pieces_of(units, c)
        q, r = divmod(units, n)
        lengths += [q + (k < r) for _ in range(blocks) for k in range(n)]
    return lengths


def makespan(case, sms: int, piece_cost: float, cut_waves: int, request_order: bool = False) -> tuple[str, float]:
    """(schedule, modelled time in units) of one case."""
    qo, kv = case.indptrs()
    tokens, heads, batch = qo[-1], case.heads, len(qo) - 1
    ctas, splits = plan_shape(sms, tokens, heads, batch, kv[-1])
    if use_persistent(tokens, heads, batch, kv[-1], ctas, splits):
        equal, segments = plan(qo, kv, heads, ctas, splits)
        return ("shares" if equal else "persistent"), max(
            sum(s.unit_end - s.unit_begin + piece_cost for s in cta) for cta in segments)
    if cut_waves:
        lengths = cut_pieces(work_of_requests(qo, kv, heads), sms, cut_waves, splits)
        return "split+cut", greedy_makespan([u + piece_cost for u in lengths], sms)
    pieces = split_pieces(qo, kv, heads, tokens * heads, ctas, splits)
    if request_order:
        pieces.sort(key=lambda piece: piece.request)  # stable: a request's row blocks and pieces stay in order
    lengths = [p.unit_end - p.unit_begin for p in pieces]
    return f"split/{splits}", greedy_makespan([u + piece_cost for u in lengths], sms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--piece-cost", type=float, default=1.0, help="fixed cost of a piece or segment, in units")
    parser.add_argument("--cut-waves", type=int, default=0, help="model cutting pieces from the lengths (0: the op's policy)")
    parser.add_argument("--request-order", action="store_true", help="model the split kernel's pieces in request order")
    args = parser.parse_args()
    equal = {case.name: case for case in grid_cases()}
    over = 0
    for case in ragged_cases():
        twin = equal[case.name.removesuffix("_ragged")]
        kind_e, time_e = makespan(twin, args.sms, args.piece_cost, args.cut_waves, args.request_order)
        kind_r, time_r = makespan(case, args.sms, args.piece_cost, args.cut_waves, args.request_order)
        # The equal batch under the op's own policy: a policy must not slow it down.
        _, time_base = makespan(twin, args.sms, args.piece_cost, 0)
        ratio = time_r / time_e
        over += ratio > 1.10
        print(f"{case.name:28s} equal {kind_e:10s} {time_e:7.1f}  ragged {kind_r:10s} {time_r:7.1f}  "
              f"ragged/equal {ratio:.3f}  equal/op's {time_e / time_base:.3f}")
    print(f"over 1.10: {over} of {len(ragged_cases())}")


if __name__ == "__main__":
    main()
