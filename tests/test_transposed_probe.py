"""bench.transposed_fp8_probe's host side: its shape names and the merge of the probe's per-range
outputs (the kernel itself runs on the GPU machine only: bench/device_transposed_probe.sh)."""

import math

import pytest
import torch

from bench.transposed_fp8_probe import merge, parse_shape


def test_shape_names():
    assert parse_shape("H16_n4_B32_P8192") == (16, 4, 32, 8192)
    with pytest.raises(ValueError, match="H<heads>"):
        parse_shape("H16_n4_B32")


def test_merging_ranges_gives_attention_over_all_keys():
    gen = torch.Generator().manual_seed(3)
    rows, keys, splits = 5, 96, 3
    s = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * 4
    v = torch.randn(keys, 8, generator=gen, dtype=torch.float64)
    whole = torch.softmax(s, -1) @ v
    parts, lses = [], []
    for r in torch.arange(keys).chunk(splits):
        parts.append(torch.softmax(s[:, r], -1) @ v[r])
        lses.append(torch.logsumexp(s[:, r], -1) / math.log(2.0))  # base 2, as the kernel writes it
    merged = merge(torch.stack(parts), torch.stack(lses))
    torch.testing.assert_close(merged, whole)
