"""What the CUDA backends' split schedules share: a function of tensor shapes only, so a captured
CUDA graph replays with any lengths that fit the shapes."""

from __future__ import annotations

import functools
import math
import os

import torch


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    return _sm_count(_device_index(device))


def resident_splits(num_tokens: int, heads: int, sms: int, block_m: int, ctas_per_sm: int) -> int:
    """Splits per row block that fit the GPU's resident CTAs (sms * ctas_per_sm), rounded down so
    the last wave is not a short one."""
    row_blocks = max(1, math.ceil(num_tokens * heads / block_m))
    return max(1, (sms * ctas_per_sm) // row_blocks)


@functools.lru_cache(maxsize=None)
def _has_dependent_launch(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def dependent_launch(device: torch.device) -> bool:
    """Whether a combine launches as a dependent of the attention kernel before it (programmatic
    dependent launch, sm_90+: its launch overlaps that kernel's tail; cutlass_kernels/
    grid_dependency.cuh), waiting for it before its first load. Not under TRITON_INTERPRET=1,
    nor with DDTREE_PDL=0 (read at every call, as the CUDA launches read it)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("DDTREE_PDL") == "0":
        return False
    return _has_dependent_launch(_device_index(device))
