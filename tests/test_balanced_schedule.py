"""The balanced schedule's plan (pure Python, the reference of the kernel's and the combine's
device formulas), checked on the CPU."""

import random

import pytest

from ddtree_op.balanced_schedule import UNIT_KEYS, plan, slots_of_row_block, use_balanced, work_of_requests


def random_batch(seed):
    rng = random.Random(seed)
    batch = rng.randint(1, 9)
    drafts = [rng.choice([0, 1, 4, 16, 33, 64]) for _ in range(batch)]
    prefixes = [rng.choice([0, 5, 127, 128, 1000, 3000, 8192]) for _ in range(batch)]
    qo, kv = [0], [0]
    for n, prefix in zip(drafts, prefixes):
        qo.append(qo[-1] + n)
        kv.append(kv[-1] + prefix + n)  # a request with no drafts has keys but no row blocks
    return qo, kv, rng.choice([1, 16, 128]), rng.choice([1, 7, 132])


@pytest.mark.parametrize("seed", range(40))
def test_every_item_once_and_shares_equal(seed):
    qo, kv, heads, ctas = random_batch(seed)
    segments = plan(qo, kv, heads, ctas)
    seen = []
    for cta_segments in segments:
        for s in cta_segments:
            seen += [(s.request, s.block, u) for u in range(s.unit_begin, s.unit_end)]
    want = [(b, j, u) for b, (blocks, units) in enumerate(work_of_requests(qo, kv, heads))
            for j in range(blocks) for u in range(units)]
    assert seen == want  # every item once, CTAs in order of their shares
    total = len(want)
    shares = [sum(s.unit_end - s.unit_begin for s in cta_segments) for cta_segments in segments]
    if total:
        used = min(ctas, total)
        assert all(total // used <= share <= -(-total // used) for share in shares[:used])
        assert all(share == 0 for share in shares[used:])


@pytest.mark.parametrize("seed", range(40))
def test_cut_row_blocks_have_unique_slots_that_the_combine_finds(seed):
    qo, kv, heads, ctas = random_batch(seed)
    segments = plan(qo, kv, heads, ctas)
    slots_by_block = {}
    for cta, cta_segments in enumerate(segments):
        for i, s in enumerate(cta_segments):
            if s.slot is not None:
                assert s.slot == 2 * cta + (0 if i == 0 else 1)
                slots_by_block.setdefault((s.request, s.block), []).append(s.slot)
        assert all(s.slot is None for s in cta_segments[1:-1])  # middle segments are whole row blocks
    all_slots = [slot for slots in slots_by_block.values() for slot in slots]
    assert len(all_slots) == len(set(all_slots))
    for b, (blocks, _) in enumerate(work_of_requests(qo, kv, heads)):
        for j in range(blocks):
            assert slots_of_row_block(qo, kv, heads, ctas, b, j) == slots_by_block.get((b, j), [])


def test_long_request_is_shared_by_several_ctas():
    # Two requests, one 6x the other: with one CTA per row block the long one sets the time.
    qo, kv = [0, 64, 128], [0, 32 * UNIT_KEYS, 32 * UNIT_KEYS + 192 * UNIT_KEYS]  # H = 1: one row block each
    segments = plan(qo, kv, 1, 4)
    assert [sum(s.unit_end - s.unit_begin for s in c) for c in segments] == [56, 56, 56, 56]
    assert segments[0][0].slot is None  # the short request whole, by CTA 0
    # The long one: CTA 0's last segment, then the first (and only) segments of CTAs 1, 2, 3.
    assert slots_of_row_block(qo, kv, 1, 4, 1, 0) == [1, 2, 4, 6]


def test_choice_needs_a_large_share_per_cta():
    # H16_n64_B8_P8192: 128 row blocks of 65 units, 63 units per CTA on 132 SMs.
    assert use_balanced(8 * 64, 16, 8, 8 * 8256, 132)
    # H16_n4_B1_P1024: 9 units in all.
    assert not use_balanced(4, 16, 1, 1028, 132)
