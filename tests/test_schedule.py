"""The split-KV schedule: a function of shapes only (pure Python, checked on the CPU)."""

import pytest

from ddtree_op.backends.sm90.schedule import fp8_kernel_for_shapes, num_kv_splits_whole_tiles
from ddtree_op.backends.triton.schedule import num_kv_splits
from ddtree_op.contract import TRITON_MAX_SPLITS as MAX_SPLITS

SMS = 132


@pytest.mark.parametrize("tokens,heads,batch,keys", [(4, 16, 1, 1028), (4, 16, 1, 8196), (256, 16, 32, 262272),
                                                     (512, 128, 8, 66048), (1, 1, 1, 1), (64, 128, 1, 65600)])
@pytest.mark.parametrize("ctas_per_sm,min_keys", [(1, 128), (2, 256)])
def test_splits_fill_at_most_one_round_of_resident_ctas(tokens, heads, batch, keys, ctas_per_sm, min_keys):
    splits = num_kv_splits(tokens, heads, batch, keys, SMS, 64, ctas_per_sm, min_keys)
    row_blocks = -(-tokens * heads // 64)
    assert 1 <= splits <= MAX_SPLITS
    assert splits == 1 or row_blocks * splits <= SMS * ctas_per_sm  # no short last wave
    assert splits == 1 or keys / batch / splits >= min_keys  # no split shorter than min_keys on average


def test_one_request_with_a_long_prefix_is_split_across_the_gpu():
    assert num_kv_splits(4, 16, 1, 8196, SMS, 64, 1, 128) == 64  # by length: 8196 // 128
    assert num_kv_splits(4, 16, 1, 65540, SMS, 64, 1, 128) == MAX_SPLITS
    assert num_kv_splits(4, 16, 1, 1028, SMS, 64, 1, 128) == 8


def test_enough_row_blocks_means_no_split():
    assert num_kv_splits(64 * 8, 128, 8, 8 * 8256, SMS, 64, 1, 128) == 1  # 1024 row blocks


@pytest.mark.parametrize("tokens,heads,batch,keys", [(4, 16, 1, 1028), (4, 16, 1, 8196), (4, 16, 8, 8 * 1028),
                                                     (64, 128, 1, 8256), (512, 128, 8, 66048), (1, 1, 1, 1)])
def test_whole_tile_splits_give_each_split_at_most_one_unit(tokens, heads, batch, keys):
    """sm_90a schedule: each split of the mean request gets at most 128 keys (one pair of tiles)
    unless the GPU's resident CTAs or the cap run out first; never more CTAs than resident."""
    splits = num_kv_splits_whole_tiles(tokens, heads, batch, keys, SMS, 64, 1, 128, 128)
    row_blocks = -(-tokens * heads // 64)
    assert 1 <= splits <= 128
    assert splits == 1 or row_blocks * splits <= SMS
    fits = max(1, min(SMS // row_blocks, 128))
    assert splits == fits or -(-keys / batch // 128) == splits  # limited by resident CTAs, or one unit per split


def test_whole_tile_splits_round_up():
    # P + n keys with n small: 1028 keys are 9 units of 128 (the 9th holds 4 keys), not 8.
    assert num_kv_splits_whole_tiles(4, 16, 1, 1028, SMS, 64, 1, 128, 128) == 9
    assert num_kv_splits_whole_tiles(4, 16, 1, 8196, SMS, 64, 1, 128, 128) == 65
    assert num_kv_splits_whole_tiles(4, 16, 1, 65540, SMS, 64, 1, 128, 128) == 128  # the cap
    assert num_kv_splits_whole_tiles(4, 16, 8, 8 * 1028, SMS, 64, 1, 128, 128) == 9  # 8 row blocks: 16 fit


@pytest.mark.parametrize("shape,kernel", [
    ((32, 16, 32, 8193 * 32, 16), "transposed"),   # H16 q_len 1, B32: 16 rows a request
    ((64, 16, 32, 8194 * 32, 8), "transposed"),    # q_len 2: 32 rows
    ((8, 16, 8, 8193 * 8, 65), "transposed"),      # 126 keys a piece, but 16 rows
    ((128, 16, 32, 8196 * 32, 4), "transposed"),   # 64 rows, 2049 keys a piece
    ((32, 16, 8, 8196 * 8, 16), "transposed"),     # 64 rows, 512 keys a piece
    ((8, 128, 8, 8193 * 8, 8), "transposed"),      # 128 rows, 1024 keys a piece
    ((128, 16, 32, 1028 * 32, 4), "widened"),      # 64 rows, 257 keys a piece
    ((32, 128, 8, 8196 * 8, 2), "transposed"),     # 512 rows, 4098 keys a piece
])
def test_fp8_kernel_for_shapes_follows_the_measured_crossover(shape, kernel):
    assert fp8_kernel_for_shapes(*shape) == kernel
