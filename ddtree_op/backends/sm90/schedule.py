"""The sm_90a split kernel's key splits per row block, from shapes only."""

from __future__ import annotations

import math

from ...contract import ROWS_PER_BLOCK, SM90_MAX_SPLITS, UNIT_KEYS
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
