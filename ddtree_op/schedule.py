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


def num_kv_splits(num_tokens: int, heads: int, batch: int, num_keys_bound: int, sms: int, block_m: int = 64,
                  ctas_per_sm: int = 2, min_keys_per_split: int = MIN_KEYS_PER_SPLIT) -> int:
    """Key-range splits per row block: as many as fit the GPU's resident CTAs (sms * ctas_per_sm;
    rounded down, so the last wave is not a short one), but no split shorter than
    min_keys_per_split keys on average (num_keys_bound / batch, a bound from shapes)."""
    row_blocks = max(1, math.ceil(num_tokens * heads / block_m))
    want = max(1, (sms * ctas_per_sm) // row_blocks)
    keys_per_request = num_keys_bound / max(batch, 1)
    by_length = max(1, int(keys_per_request // min_keys_per_split))
    return max(1, min(want, by_length, MAX_SPLITS))
