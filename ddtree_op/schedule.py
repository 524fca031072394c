"""Split-KV schedule shared by the CUDA backends: a function of tensor shapes only, so a
captured CUDA graph replays with any lengths that fit the shapes."""

from __future__ import annotations

import functools
import math

import torch

MAX_SPLITS = 64
MIN_KEYS_PER_SPLIT = 256


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _resident_splits(num_tokens: int, heads: int, sms: int, block_m: int, ctas_per_sm: int) -> int:
    """Splits per row block that fit the GPU's resident CTAs (sms * ctas_per_sm), rounded down so
    the last wave is not a short one."""
    row_blocks = max(1, math.ceil(num_tokens * heads / block_m))
    return max(1, (sms * ctas_per_sm) // row_blocks)


def num_kv_splits(num_tokens: int, heads: int, batch: int, num_keys_bound: int, sms: int, block_m: int = 64,
                  ctas_per_sm: int = 2, min_keys_per_split: int = MIN_KEYS_PER_SPLIT) -> int:
    """Key-range splits per row block: as many as fit the GPU's resident CTAs, but no split
    shorter than min_keys_per_split keys on average (num_keys_bound / batch, a bound from shapes)."""
    keys_per_request = num_keys_bound / max(batch, 1)
    by_length = max(1, int(keys_per_request // min_keys_per_split))
    return max(1, min(_resident_splits(num_tokens, heads, sms, block_m, ctas_per_sm), by_length, MAX_SPLITS))


def num_kv_splits_whole_tiles(num_tokens: int, heads: int, batch: int, num_keys_bound: int, sms: int, block_m: int,
                              ctas_per_sm: int, keys_per_split: int, max_splits: int) -> int:
    """For a kernel whose splits hold whole multiples of keys_per_split keys (the sm_90a kernel's
    pairs of tiles): one split per keys_per_split keys of the mean request, rounded up (P + n keys
    with n small would otherwise leave each split two units and half the splits empty), as many
    as fit the GPU's resident CTAs, at most max_splits."""
    keys_per_request = num_keys_bound / max(batch, 1)
    by_length = max(1, math.ceil(keys_per_request / keys_per_split))
    return max(1, min(_resident_splits(num_tokens, heads, sms, block_m, ctas_per_sm), by_length, max_splits))
