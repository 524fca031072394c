"""The persistent kernel's schedule (pure Python, the reference of the kernel's and the combine's
device formulas), checked on the CPU."""

import random

import pytest

from ddtree_op.backends.sm90.persistent_schedule import (choose_equal_shares, plan, slots_of_row_block, use_persistent,
                                                        work_of_requests)
from ddtree_op.contract import UNIT_KEYS


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


@pytest.mark.parametrize("seed", range(60))
def test_every_item_once(seed):
    qo, kv, heads, ctas, splits = random_batch(seed)
    equal, segments = plan(qo, kv, heads, ctas, splits)
    want = [(b, j, u) for b, (blocks, units) in enumerate(work_of_requests(qo, kv, heads))
            for j in range(blocks) for u in range(units)]
    if equal:  # CTAs in order of their shares
        assert items_in_order([s for cta in segments for s in cta]) == want
    else:  # pieces: row blocks in order, each's splits in order
        pieces = sorted((s for cta in segments for s in cta), key=lambda s: (s.request, s.block, s.unit_begin, s.unit_end))
        assert items_in_order(pieces) == want


@pytest.mark.parametrize("seed", range(60))
def test_equal_shares_differ_by_at_most_one_unit(seed):
    qo, kv, heads, ctas, splits = random_batch(seed)
    equal, segments = plan(qo, kv, heads, ctas, splits)
    if not equal:
        pytest.skip("this batch gets the pieces schedule")
    shares = [sum(s.unit_end - s.unit_begin for s in cta) for cta in segments]
    used = min(ctas, sum(shares))
    assert max(shares[:used]) - min(shares[:used]) <= 1 and not any(shares[used:])
    for cta, cta_segments in enumerate(segments):
        assert all(s.slot is None for s in cta_segments[1:-1])  # middle segments are whole row blocks
        for i, s in enumerate(cta_segments):
            assert s.slot is None or s.slot == 2 * cta + (0 if i == 0 else 1)


@pytest.mark.parametrize("seed", range(60))
def test_partial_slots_are_unique_and_the_combine_finds_them(seed):
    qo, kv, heads, ctas, splits = random_batch(seed)
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
    from gpu_cases import ATTENTION_CASES, EDGE_CASES, PERSISTENT_SCHEDULES

    from ddtree_op.backends.sm90.schedule import sm90_splits

    seen = set()
    for prefix, drafts, heads in ATTENTION_CASES + EDGE_CASES:
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
            if equal and any(s.slot is not None and s.unit_begin > 0 and len(cta) > 1 for cta in segments for s in cta[:1]):
                seen.add("a first segment deferred")
    assert seen == {("equal shares", "partials"), ("equal shares", "whole row blocks"), ("pieces", "partials"),
                    ("pieces", "whole row blocks"), "a first segment deferred"}
