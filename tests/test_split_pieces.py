"""The split kernel's pieces (ddtree_op/backends/sm90/schedule.py): the plan's piece arrays, read
as the kernel and the piece combine read them, are the Python reference's pieces; a batch of
equal requests keeps the shapes' splits; a ragged one cuts its long requests into more pieces,
never longer than the shapes' splits of the longest request would be."""

import itertools

import pytest
import torch

from ddtree_op import contract
from ddtree_op.backends.sm90.persistent_schedule import work_of_requests
from ddtree_op.backends.sm90.schedule import Piece, split_pieces
from ddtree_op.prep import verify_plan

from test_persistent_schedule import plan_batch, read_plan


def longest_piece_of_requests(pieces):
    """Units of each request's longest piece (the key of the pieces' longest-first order)."""
    longest = {}
    for piece in pieces:
        longest[piece.request] = max(longest.get(piece.request, 0), piece.unit_end - piece.unit_begin)
    return longest


def pieces_of_plan(plan, num_rows, heads, batch):
    """The pieces in CTA order, as tile_scheduler.cuh's plan_piece reads them."""
    capacity = contract.plan_capacity(num_rows, heads, batch)
    slots = contract.piece_capacity(num_rows, heads, batch)
    values = plan.tolist()
    header, field = read_plan(plan, capacity)
    start = contract.PLAN_HEADER + contract.PLAN_FIELDS * capacity

    def piece(f, p):
        return values[start + f * slots + p]

    pieces = []
    for p in range(header[contract.PLAN_PIECES]):
        row, units, slot = (piece(contract.PIECE_ROW, p), piece(contract.PIECE_UNITS, p), piece(contract.PIECE_SLOT, p))
        pieces.append(Piece(row >> 32, row & 0xFFFFFFFF, units >> 32, units & 0xFFFFFFFF,
                            None if slot < 0 else slot & 0xFFFFFFFF,
                            slot >> 32 if slot >= 0 else 1))
    past = [(piece(contract.PIECE_ROW, p), piece(contract.PIECE_UNITS, p), piece(contract.PIECE_SLOT, p))
            for p in range(header[contract.PLAN_PIECES], slots)]
    assert past == [(batch << 32, 0, -1)] * len(past)
    # The combine's view: the pieces are runs, one per row block, requests longest piece first
    # (ties and batches past LONGEST_FIRST_MAX_BATCH in request order) and a request's row blocks
    # in order (the plan may list its row blocks lane by lane, so they are sorted), and a run's
    # pieces are its slots 0 .. n - 1 (n of them; one piece with one split) that cover its row
    # block's units once, in order.
    longest = longest_piece_of_requests(pieces)
    first = (lambda request: -longest[request]) if batch <= contract.LONGEST_FIRST_MAX_BATCH else (lambda request: 0)
    row_blocks = sorted(((field(contract.PLAN_REQUEST, r), field(contract.PLAN_BLOCK, r), field(contract.PLAN_UNITS, r))
                         for r in range(header[contract.PLAN_ROW_BLOCKS])),
                        key=lambda row_block: (first(row_block[0]), row_block[0], row_block[1]))
    runs = [list(run) for _, run in itertools.groupby(pieces, key=lambda piece: (piece.request, piece.block))]
    assert [(run[0].request, run[0].block) for run in runs] == [(request, block) for request, block, _ in row_blocks]
    splits = header[contract.PLAN_SPLITS]
    for (_, _, units), run in zip(row_blocks, runs):
        assert [piece.slot for piece in run] == (list(range(len(run))) if splits > 1 else [None])
        assert all(piece.pieces == len(run) for piece in run)
        bounds = [0] + [end for piece in run for end in (piece.unit_begin, piece.unit_end)] + [units]
        assert bounds == sorted(bounds) and all(begin == end for begin, end in zip(bounds[::2], bounds[1::2]))
    return pieces


@pytest.mark.parametrize("seed", range(300))
def test_plan_pieces_are_the_reference_pieces(seed):
    qo, kv, num_rows, heads, ctas, splits = plan_batch(seed)
    batch = len(qo) - 1
    plan = verify_plan(torch.tensor(qo), torch.tensor(kv, dtype=torch.int32), num_rows, heads, ctas, splits)
    pieces = pieces_of_plan(plan, num_rows, heads, batch)
    assert pieces == split_pieces(qo, kv, heads, num_rows, ctas, splits)
    # Every row block's units are covered once, in order, by its pieces.
    work = work_of_requests(qo, kv, heads)
    covered = {}
    for piece in pieces:
        covered.setdefault((piece.request, piece.block), []).append((piece.unit_begin, piece.unit_end))
    for b, (row_blocks, units) in enumerate(work):
        for j in range(row_blocks):
            ranges = covered.pop((b, j))
            assert ranges[0][0] == 0 and ranges[-1][1] == units
            assert all(end == begin for (_, end), (begin, _) in zip(ranges, ranges[1:]))
            assert len(ranges) == 1 or all(end > begin for begin, end in ranges)
    assert not covered
    # With splits, a row block's pieces are its partial slots 0 .. n - 1, at most
    # PIECE_SLOTS_PER_SPLIT * splits; with one split they write out/lse directly.
    for (b, j), ranges in slots_of(pieces).items():
        assert ranges == list(range(len(ranges))) and len(ranges) <= contract.PIECE_SLOTS_PER_SPLIT * splits
    assert all((piece.slot is None) == (splits == 1) for piece in pieces)
    # The grid has room for every piece and a CTA past them.
    assert len(pieces) < contract.split_grid(num_rows, heads, batch, splits) <= contract.piece_capacity(num_rows, heads, batch)


def slots_of(pieces):
    found = {}
    for piece in pieces:
        if piece.slot is not None:
            found.setdefault((piece.request, piece.block), []).append(piece.slot)
    return found


def batch_of(prefixes, drafts):
    qo, kv = [0], [0]
    for n, prefix in zip(drafts, prefixes):
        qo.append(qo[-1] + n)
        kv.append(kv[-1] + prefix + n)
    return qo, kv


@pytest.mark.parametrize("heads,drafts,batch,prefix,splits", [
    (16, 4, 8, 8192, 16), (16, 16, 8, 8192, 4), (16, 4, 32, 8192, 4), (128, 4, 8, 8192, 2), (16, 4, 1, 1024, 9),
    (16, 16, 8, 1000, 4),
])
def test_equal_requests_keep_the_shapes_splits(heads, drafts, batch, prefix, splits):
    qo, kv = batch_of([prefix] * batch, [drafts] * batch)
    pieces = split_pieces(qo, kv, heads, qo[-1], 132, splits)
    units = -(-(prefix + drafts) // contract.UNIT_KEYS)
    per_row_block = {}
    for piece in pieces:
        per_row_block.setdefault((piece.request, piece.block), []).append(piece.unit_end - piece.unit_begin)
    for lengths in per_row_block.values():
        assert len(lengths) <= splits and max(lengths) <= -(-units // splits)


@pytest.mark.parametrize("heads,drafts,batch,splits", [(16, 16, 8, 4), (16, 4, 32, 4), (128, 4, 8, 2), (16, 4, 8, 16)])
def test_ragged_requests_get_pieces_by_length(heads, drafts, batch, splits):
    prefixes = [4096 + 8192 * b // (batch - 1) for b in range(batch)]  # 4096 .. 12288, mean 8192
    qo, kv = batch_of(prefixes, [drafts] * batch)
    pieces = split_pieces(qo, kv, heads, qo[-1], 132, splits)
    longest_piece = max(p.unit_end - p.unit_begin for p in pieces)
    longest_request = -(-(prefixes[-1] + drafts) // contract.UNIT_KEYS)
    mean_request = -(-(8192 + drafts) // contract.UNIT_KEYS)
    # Shorter than the longest request's pieces under equal splits, near the mean request's.
    assert longest_piece < -(-longest_request // splits)
    assert longest_piece <= 1.3 * -(-mean_request // splits)
    row_blocks = batch * -(-drafts * heads // contract.ROWS_PER_BLOCK)
    assert len(pieces) <= row_blocks * splits


@pytest.mark.parametrize("batch", [8, 32, contract.LONGEST_FIRST_MAX_BATCH, contract.LONGEST_FIRST_MAX_BATCH + 1])
@pytest.mark.parametrize("splits", [1, 2])
def test_pieces_go_longest_first(batch, splits):
    """Prefixes growing with the request (the longest last): the longest pieces come first, so the hardware
    starts them in the first wave; past LONGEST_FIRST_MAX_BATCH requests, and for equal requests,
    request order. The plan agrees (the other tests compare it with this reference)."""
    prefixes = [1024 + 2048 * b // (batch - 1) for b in range(batch)]
    qo, kv = batch_of(prefixes, [4] * batch)
    pieces = split_pieces(qo, kv, 16, qo[-1], 132, splits)
    requests = [piece.request for piece in pieces]
    if batch <= contract.LONGEST_FIRST_MAX_BATCH:
        longest = longest_piece_of_requests(pieces)
        assert requests == sorted(requests, key=lambda request: (-longest[request], request))
        assert longest[requests[0]] == max(longest.values()) and requests != sorted(requests)
    else:
        assert requests == sorted(requests)
    qo, kv = batch_of([2048] * batch, [4] * batch)
    requests = [piece.request for piece in split_pieces(qo, kv, 16, qo[-1], 132, splits)]
    assert requests == sorted(requests)
    plan = verify_plan(torch.tensor(qo), torch.tensor(kv, dtype=torch.int32), qo[-1], 16, 132, splits)
    assert pieces_of_plan(plan, qo[-1], 16, batch) == split_pieces(qo, kv, 16, qo[-1], 132, splits)
