"""The persistent kernel's schedule (pure Python, the reference of the kernel's device formulas),
checked on the CPU."""

import random

import pytest
import torch

from ddtree_op import contract
from ddtree_op.backends.sm90.persistent_schedule import (Segment, choose_equal_shares, plan, row_block_order, share_lanes,
                                                        slots_of_row_block, split_units, use_persistent, work_of_requests)
from ddtree_op.contract import UNIT_KEYS
from ddtree_op.prep import verify_plan


def random_batch(seed):
    rng = random.Random(seed)
    batch = rng.randint(1, 9)
    drafts = [rng.choice([0, 1, 4, 16, 33, 64]) for _ in range(batch)]
    prefixes = [rng.choice([0, 5, 127, 128, 1000, 3000, 8192]) for _ in range(batch)]
    qo, kv = [0], [0]
    for n, prefix in zip(drafts, prefixes):
        qo.append(qo[-1] + n)
        kv.append(kv[-1] + prefix + n)  # a request with no drafts has keys but no row blocks
    heads, ctas = rng.choice([1, 16, 128]), rng.choice([1, 7, 132])
    return qo, kv, heads, ctas, rng.choice([1, 1, 2, 5, 40])


def items_in_order(segments):
    return [(s.request, s.block, u) for s in segments for u in range(s.unit_begin, s.unit_end)]


def lane_batch(seed):
    """A batch whose requests all have the same drafts and unequal prefixes (a serving step's
    verify), so that equal shares go lane by lane where the row blocks divide the CTAs well."""
    rng = random.Random(seed)
    batch, drafts = rng.randint(2, 40), rng.choice([1, 4, 16, 64])
    qo, kv = [0], [0]
    for _ in range(batch):
        qo.append(qo[-1] + drafts)
        kv.append(kv[-1] + rng.randint(0, 12288) + drafts)
    heads, ctas = rng.choice([16, 128]), rng.choice([7, 16, 132])
    return qo, kv, heads, ctas, 1


BATCHES = [random_batch(seed) for seed in range(60)] + [lane_batch(seed) for seed in range(60)]


@pytest.mark.parametrize("batch", BATCHES)
def test_every_item_once(batch):
    qo, kv, heads, ctas, splits = batch
    equal, segments = plan(qo, kv, heads, ctas, splits)
    work = work_of_requests(qo, kv, heads)
    if equal:  # CTAs in order of their shares, which follow the row blocks' item order
        lanes, _ = share_lanes(work, ctas)
        want = [(b, j, u) for b, j, units in row_block_order(work, lanes) for u in range(units)]
        assert items_in_order([s for cta in segments for s in cta]) == want
    else:  # pieces: row blocks in order, each's splits in order
        want = [(b, j, u) for b, (blocks, units) in enumerate(work) for j in range(blocks) for u in range(units)]
        pieces = sorted((s for cta in segments for s in cta), key=lambda s: (s.request, s.block, s.unit_begin, s.unit_end))
        assert items_in_order(pieces) == want


@pytest.mark.parametrize("batch", BATCHES)
def test_equal_shares_differ_by_at_most_one_unit(batch):
    qo, kv, heads, ctas, splits = batch
    equal, segments = plan(qo, kv, heads, ctas, splits)
    if not equal:
        pytest.skip("this batch gets the pieces schedule")
    shares = [sum(s.unit_end - s.unit_begin for s in cta) for cta in segments]
    _, used = share_lanes(work_of_requests(qo, kv, heads), ctas)
    assert max(shares[:used]) - min(shares[:used]) <= 1 and not any(shares[used:])
    for cta, cta_segments in enumerate(segments):
        assert all(s.slot is None for s in cta_segments[1:-1])  # middle segments are whole row blocks
        for i, s in enumerate(cta_segments):
            assert s.slot is None or s.slot == 2 * cta + (0 if i == 0 else 1)


@pytest.mark.parametrize("batch", BATCHES)
def test_partial_slots_are_unique_and_the_combine_finds_them(batch):
    qo, kv, heads, ctas, splits = batch
    _, segments = plan(qo, kv, heads, ctas, splits)
    slots_by_block = {}
    for s in sorted((s for cta in segments for s in cta), key=lambda s: (s.request, s.block, s.unit_begin, s.unit_end)):
        if s.slot is not None:
            slots_by_block.setdefault((s.request, s.block), []).append(s.slot)
    all_slots = [slot for slots in slots_by_block.values() for slot in slots]
    assert len(all_slots) == len(set(all_slots)) and all(0 <= slot < 2 * ctas for slot in all_slots)
    for b, (blocks, _) in enumerate(work_of_requests(qo, kv, heads)):
        for j in range(blocks):
            assert slots_of_row_block(qo, kv, heads, ctas, splits, b, j) == slots_by_block.get((b, j), [])


@pytest.mark.parametrize("seed", range(60))
def test_lane_shares_take_the_same_keys_in_every_lane(seed):
    qo, kv, heads, ctas, splits = lane_batch(seed)
    work = work_of_requests(qo, kv, heads)
    equal, segments = plan(qo, kv, heads, ctas, splits)
    lanes, used = share_lanes(work, ctas)
    if not (equal and lanes):
        pytest.skip("this batch gets pieces, or equal shares in request order")
    parts = used // lanes
    assert lanes == work[0][0] and used <= ctas and 8 * used >= contract.LANE_SHARES_MIN_USE * ctas
    for p in range(parts):  # CTA j P + p of every lane j: row block j, the same requests and units
        shapes = [[(s.request, s.unit_begin, s.unit_end, s.slot is None) for s in segments[j * parts + p]] for j in range(lanes)]
        assert all(shape == shapes[0] for shape in shapes)
        assert all(s.block == j for j in range(lanes) for s in segments[j * parts + p])
    assert not any(segments[used:])


def test_lane_shares_for_equal_drafts_and_unequal_prefixes():
    # H16_n16_B32_P8192_ragged's kind: 4 row blocks a request, 132 CTAs -> 33 parts of 4 lanes.
    qo = [16 * b for b in range(33)]
    kv = [0]
    for b in range(32):
        kv.append(kv[-1] + (4096 if b % 2 else 12288) + 16)
    work = work_of_requests(qo, kv, 16)
    assert choose_equal_shares(work, 132, 1) and share_lanes(work, 132) == (4, 132)
    assert share_lanes(work, 100) == (4, 100) and share_lanes(work, 130) == (4, 128)
    assert share_lanes([(34, 64)] * 8, 132) == (0, 132)  # 3 parts of 34 lanes: 102 of 132 CTAs
    assert share_lanes([(4, 64)] * 7 + [(3, 64)], 132)[0] == 0  # unequal row blocks
    assert share_lanes([(4, 64)] * (contract.LANE_SHARES_MAX_BATCH + 1), 132)[0] == 0


def test_unequal_requests_get_equal_shares_and_equal_ones_pieces():
    # 8 requests of one row block each on 8 CTAs: pieces are whole requests.
    uniform = [(1, 64)] * 8
    assert not choose_equal_shares(uniform, 8, 1)
    # One request 6x the others: its CTA would take 6x as long.
    assert choose_equal_shares([(1, 32)] * 7 + [(1, 192)], 8, 1)


def test_long_request_is_shared_by_several_ctas():
    qo, kv = [0, 64, 128], [0, 32 * UNIT_KEYS, 32 * UNIT_KEYS + 192 * UNIT_KEYS]  # H = 1: one row block each
    equal, segments = plan(qo, kv, 1, 4, 1)
    assert equal
    assert [sum(s.unit_end - s.unit_begin for s in c) for c in segments] == [56, 56, 56, 56]
    assert segments[0][0].slot is None  # the short request whole, by CTA 0
    # The long one: CTA 0's last segment, then the first (and only) segments of CTAs 1, 2, 3.
    assert slots_of_row_block(qo, kv, 1, 4, 1, 1, 0) == [1, 2, 4, 6]


def test_persistent_kernel_for_one_or_two_waves_of_large_shares():
    assert use_persistent(8 * 64, 16, 8, 8 * 8256, 132, 1)  # H16_n64_B8_P8192: 128 row blocks of 65 units
    assert use_persistent(32 * 4, 128, 32, 32 * 8196, 132, 1)  # H128_n4_B32_P8192: 256 row blocks, 2 waves
    assert not use_persistent(8 * 64, 128, 8, 8 * 8256, 132, 1)  # H128_n64_B8_P8192: 8 waves
    assert not use_persistent(32 * 4, 128, 32, 32 * 1028, 132, 1)  # H128_n4_B32_P1024: 17.5 units per CTA
    assert not use_persistent(32 * 4, 16, 32, 32 * 8196, 132, 4)  # H16_n4_B32_P8192: 4 splits per row block
    assert not use_persistent(4, 16, 1, 1028, 132, 9)  # H16_n4_B1_P1024: 9 units in all
    assert not use_persistent(64, 128, 1, 8256, 132, 1)  # H128_n64_B1_P8192: one request is never unequal


def test_gpu_tests_cover_both_plans_and_both_kinds_of_partials():
    """tests/test_gpu_persistent.py runs the persistent kernel on these cases and CTA counts; the device picks
    the plan from the lengths, so check here that they reach every path of it."""
    from gpu_cases import ATTENTION_CASES, EDGE_CASES, LANE_CASES, PERSISTENT_SCHEDULES

    from ddtree_op.backends.sm90.schedule import sm90_splits

    seen = set()
    for prefix, drafts, heads in ATTENTION_CASES + EDGE_CASES + LANE_CASES:
        qo, kv = [0], [0]
        for p, n in zip(prefix, drafts):
            qo.append(qo[-1] + n)
            kv.append(kv[-1] + p + n)
        for ctas, splits in PERSISTENT_SCHEDULES:
            tokens = qo[-1] + 3  # the GPU tests pad 3 rows
            splits = splits or sm90_splits(tokens, heads, len(prefix), kv[-1], ctas)
            equal, segments = plan(qo, kv, heads, ctas, splits)
            slots = [s.slot for cta in segments for s in cta if s.slot is not None]
            seen.add(("equal shares" if equal else "pieces", "partials" if slots else "whole row blocks"))
            if equal and share_lanes(work_of_requests(qo, kv, heads), ctas)[0] > 1:
                seen.add(("lane by lane", "partials" if slots else "whole row blocks"))
            if equal and any(s.slot is not None and s.unit_begin > 0 and len(cta) > 1 for cta in segments for s in cta[:1]):
                seen.add("a first segment deferred")
    assert seen == {("equal shares", "partials"), ("equal shares", "whole row blocks"), ("pieces", "partials"),
                    ("pieces", "whole row blocks"), ("lane by lane", "partials"), ("lane by lane", "whole row blocks"),
                    "a first segment deferred"}


# The plan the preparation makes (prep.verify_plan, the CPU twin of cutlass_kernels/verify_plan.cuh),
# read as the kernels read it, gives the segments and slots of the Python schedule.


def read_plan(plan, capacity):
    plan = plan.tolist()
    header = plan[:contract.PLAN_HEADER]

    def field(f, r):
        return plan[contract.PLAN_HEADER + f * capacity + r]

    return header, field


def segments_of_plan(plan, capacity, ctas, splits):
    """Each CTA's segments in processing order, as tile_scheduler.cuh reads them from the plan."""
    header, field = read_plan(plan, capacity)
    row_blocks, total, used = header[contract.PLAN_ROW_BLOCKS], header[contract.PLAN_ITEMS], header[contract.PLAN_USED]
    equal = bool(header[contract.PLAN_EQUAL_SHARES])
    result = []
    for cta in range(ctas):
        segments = []
        if not equal:
            piece = cta
            while piece < row_blocks * splits:
                r = piece // splits
                units = field(contract.PLAN_UNITS, r)
                begin, end = split_units(units, splits, piece % splits)
                segments.append(Segment(field(contract.PLAN_REQUEST, r), field(contract.PLAN_BLOCK, r), begin, end,
                                        piece if splits > 1 else None))
                piece += ctas
        elif cta < used:
            begin, end = cta * total // used, (cta + 1) * total // used
            first = sum(field(contract.PLAN_FIRST_ITEM, r) <= begin for r in range(row_blocks)) - 1  # the binary search
            start, units = field(contract.PLAN_FIRST_ITEM, first), field(contract.PLAN_UNITS, first)
            r = first
            while r < row_blocks and field(contract.PLAN_FIRST_ITEM, r) < end:
                start, units = field(contract.PLAN_FIRST_ITEM, r), field(contract.PLAN_UNITS, r)
                lo, hi = max(begin, start), min(end, start + units)
                whole = lo == start and hi == start + units
                segments.append(Segment(field(contract.PLAN_REQUEST, r), field(contract.PLAN_BLOCK, r), lo - start,
                                        hi - start, None if whole else 2 * cta + (0 if lo == begin else 1)))
                r += 1
            if segments[0].unit_begin > 0 and len(segments) > 1:  # a first segment cut at its start goes last
                segments = segments[1:] + segments[:1]
        result.append(segments)
    return equal, result


def slots_of_plan(plan, capacity, ctas, splits, qo, heads):
    """(request, block) -> partial slots of each cut row block, as the kernel's merge finds them
    from the plan (tile_scheduler.cuh's partial_slots)."""
    header, field = read_plan(plan, capacity)
    row_blocks, total, used = header[contract.PLAN_ROW_BLOCKS], header[contract.PLAN_ITEMS], header[contract.PLAN_USED]
    equal = bool(header[contract.PLAN_EQUAL_SHARES])
    found = {}
    for r in range(row_blocks):
        key = (field(contract.PLAN_REQUEST, r), field(contract.PLAN_BLOCK, r))
        if equal:
            start, units = field(contract.PLAN_FIRST_ITEM, r), field(contract.PLAN_UNITS, r)
            first, last = ((start + 1) * used - 1) // total, ((start + units) * used - 1) // total
            if units and first != last:
                found[key] = [2 * first + (0 if first * total // used == start else 1)] + [2 * i for i in range(first + 1, last + 1)]
        elif splits > 1:
            found[key] = list(range(r * splits, (r + 1) * splits))
    return found


def plan_batch(seed):
    """A random batch with what the preparation hands the kernel: ragged, empty and zero-draft
    requests, B = 1, padding rows."""
    rng = random.Random(seed)
    batch = rng.choice([0, 1, 1, 2, 5, 9, 40])
    drafts = [rng.choice([0, 1, 4, 16, 33, 64]) for _ in range(batch)]
    prefixes = [rng.choice([0, 5, 127, 128, 1000, 3000, 8192]) for _ in range(batch)]
    qo, kv = [0], [0]
    for n, prefix in zip(drafts, prefixes):
        qo.append(qo[-1] + n)
        kv.append(kv[-1] + prefix + n)
    heads, ctas = rng.choice([1, 16, 128]), rng.choice([1, 7, 132])
    return qo, kv, qo[-1] + rng.choice([0, 0, 3, 70]), heads, ctas, rng.choice([1, 1, 2, 5, 40])


def lane_plan_batch(seed):
    qo, kv, heads, ctas, splits = lane_batch(seed)
    return qo, kv, qo[-1] + random.Random(seed).choice([0, 3]), heads, ctas, splits


@pytest.mark.parametrize("batch", [plan_batch(seed) for seed in range(300)] + [lane_plan_batch(seed) for seed in range(60)])
def test_plan_gives_the_schedule_segments_and_slots(batch):
    qo, kv, num_rows, heads, ctas, splits = batch
    plan_tensor = verify_plan(torch.tensor(qo), torch.tensor(kv, dtype=torch.int32), num_rows, heads, ctas, splits)
    capacity = contract.plan_capacity(num_rows, heads, len(qo) - 1)
    assert plan_tensor.dtype == torch.int64 and plan_tensor.numel() == contract.plan_numel(num_rows, heads, len(qo) - 1)
    header, field = read_plan(plan_tensor, capacity)
    assert header[contract.PLAN_HEADS:contract.PLAN_SPLITS + 1] == [heads, ctas, splits]
    equal, want = plan(qo, kv, heads, ctas, splits) if len(qo) > 1 else (False, [[] for _ in range(ctas)])
    for cta, segments in enumerate(want):  # the kernel processes a cut first segment last
        if equal and len(segments) > 1 and segments[0].unit_begin > 0:
            want[cta] = segments[1:] + segments[:1]
    assert segments_of_plan(plan_tensor, capacity, ctas, splits) == (equal, want)
    blocks = [(b, j) for b, (n, _) in enumerate(work_of_requests(qo, kv, heads)) for j in range(n)]
    found = slots_of_plan(plan_tensor, capacity, ctas, splits, qo, heads)
    for b, j in blocks:
        assert found.get((b, j), []) == slots_of_row_block(qo, kv, heads, ctas, splits, b, j)
    # Past the row blocks: request B, no units, first item = all items.
    row_blocks = header[contract.PLAN_ROW_BLOCKS]
    assert row_blocks == len(blocks)
    for r in range(row_blocks, capacity):
        assert [field(f, r) for f in range(contract.PLAN_FIELDS)] == [len(qo) - 1, 0, 0, header[contract.PLAN_ITEMS]]
