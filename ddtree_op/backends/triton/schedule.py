"""The Triton kernel's key splits per row block, from shapes only."""

from __future__ import annotations

from ...contract import ROWS_PER_BLOCK, TRITON_MAX_SPLITS
from ..splits import resident_splits

MIN_KEYS_PER_SPLIT = 256


def num_kv_splits(num_tokens: int, heads: int, batch: int, num_keys_bound: int, sms: int, block_m: int = ROWS_PER_BLOCK,
                  ctas_per_sm: int = 2, min_keys_per_split: int = MIN_KEYS_PER_SPLIT) -> int:
    """Key-range splits per row block: as many as fit the GPU's resident CTAs, but no split
    shorter than min_keys_per_split keys on average (num_keys_bound / batch, a bound from shapes)."""
    keys_per_request = num_keys_bound / max(batch, 1)
    by_length = max(1, int(keys_per_request // min_keys_per_split))
    return max(1, min(resident_splits(num_tokens, heads, sms, block_m, ctas_per_sm), by_length, TRITON_MAX_SPLITS))
