"""bench/schedule_model.py: the work model of the sm_90a schedules (CPU only)."""

from bench.cases import Case
from bench.schedule_model import cut_pieces, greedy_makespan, makespan


def test_greedy_makespan_fills_the_sm_that_frees_first():
    assert greedy_makespan([3.0, 1.0, 1.0, 1.0], sms=2) == 3.0
    assert greedy_makespan([2.0] * 5, sms=2) == 6.0


def test_cut_pieces_keep_every_unit_and_the_slot_limit():
    work = [(4, 13), (4, 5), (2, 0)]
    lengths = cut_pieces(work, sms=8, waves=2, splits=1)
    assert sum(lengths) == 4 * 13 + 4 * 5
    assert len(lengths) <= 2 * 8 + 2  # within the waves (the unit-less row blocks count as pieces too)
    assert max(lengths) <= 13


def test_an_equal_batch_in_one_wave_takes_one_row_block_and_its_piece_cost():
    # 32 requests x 4 row blocks of 9 units (1040 keys), one split each: 128 pieces on 132 SMs.
    case = Case("equal", 16, (1024,) * 32, (16,) * 32)
    assert makespan(case, sms=132, piece_cost=1.0, cut_waves=0) == ("split/1", 10.0)


def test_longest_first_starts_the_long_pieces_first():
    # 256 row blocks (two waves) whose lengths grow with the request: in request order the longest
    # start last; longest first (the op's order), they start at once and the short ones fill in.
    case = Case("growing", 128, tuple(512 + 64 * b for b in range(32)), (4,) * 32)
    _, longest_first = makespan(case, sms=132, piece_cost=1.0, cut_waves=0)
    _, in_order = makespan(case, sms=132, piece_cost=1.0, cut_waves=0, request_order=True)
    assert longest_first < in_order
