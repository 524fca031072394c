"""The sm90 backend: the host side of the sm_90a CuTe/wgmma kernel (cutlass_kernels/sm90/).

- attention.py: the launch (split or persistent kernel, partial buffers, the split kernel's combine);
- schedule.py: how many key splits per row block and CTAs, from shapes (what the preparation makes
  the schedule plan for);
- persistent_schedule.py: the schedule in Python (the test oracle of the plan that the
  preparation makes on the device) and the shape-only choice of the persistent kernel.
The split kernel's partials are merged by the shared combine (backends/lse_merge.py); the
persistent kernel merges its own (cutlass_kernels/sm90/merge.cuh).
"""

from __future__ import annotations

import torch

from .attention import tree_attention_sm90
from .schedule import plan_shape


def _rows_aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all(stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1])


def sm90_accepts(q: torch.Tensor, kv_rows: torch.Tensor, out: torch.Tensor) -> bool:
    """The kernel copies q and KV rows and stores output rows in 16-byte pieces, so every row must
    be 16-byte aligned (base pointer, and token/head/slot strides in multiples of 16 bytes).
    The Triton kernel takes any strides, so "auto" sends others there."""
    return _rows_aligned(q) and _rows_aligned(kv_rows) and _rows_aligned(out)


def accepts(inputs) -> bool:
    """`inputs`: a backends.InputClass. KV of q's dtype or e4m3 (dequantized in the kernel)."""
    return inputs.rows_16b_aligned and inputs.kv_dtype in (inputs.dtype, torch.float8_e4m3fn)


run = tree_attention_sm90
