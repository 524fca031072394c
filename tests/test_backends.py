"""Backend choice: the layouts the sm_90a kernel takes (16-byte aligned rows) and "auto" without the
CUTLASS headers, checked on the CPU."""

import warnings

import pytest
import torch

from ddtree_op.backends.sm90 import sm90_accepts


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def test_sm90_accepts_aligned_rows_only():
    q, kv, out = _bf16(4, 2, 576), _bf16(10, 576), _bf16(4, 2, 512)
    assert sm90_accepts(q, kv, out)
    assert sm90_accepts(_bf16(4, 3, 608)[:, 1:, 16:592], kv, out)  # strided view, rows still aligned
    assert sm90_accepts(q, _bf16(10, 1, 640)[:, 0, :576], out)  # SGLang-style row stride > 576
    assert sm90_accepts(q, kv, _bf16(4, 2, 520)[..., 8:])  # out rows 16-byte aligned

    shifted = _bf16(4 * 2 * 576 + 1)[1:].view(4, 2, 576)  # base pointer 2 bytes off
    assert not sm90_accepts(shifted, kv, out)
    assert not sm90_accepts(_bf16(4, 2, 577)[..., :576], kv, out)  # head stride 577 elements
    assert not sm90_accepts(q, _bf16(10, 580)[:, :576], out)  # row stride 580 elements
    assert not sm90_accepts(q, kv, _bf16(4, 2, 513)[..., :512])  # out head stride odd
    assert not sm90_accepts(q, kv, _bf16(4, 2, 514)[..., 2:])  # out rows only 4-byte aligned


def test_sm90_accepts_fp8_rows_in_bytes():
    """An e4m3 cache's rows are 576 bytes: the 16-byte rule counts bytes, not elements."""
    from ddtree_op.backends import InputClass
    from ddtree_op.backends.sm90 import accepts

    q, out = _bf16(4, 2, 576), _bf16(4, 2, 512)
    fp8 = torch.zeros(10, 592, dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert sm90_accepts(q, fp8[:, :576], out)  # row stride 592 bytes
    assert sm90_accepts(q, fp8[:, 16:592], out)
    assert not sm90_accepts(q, torch.zeros(10, 584, dtype=torch.uint8).view(torch.float8_e4m3fn)[:, :576], out)  # 584 bytes
    assert not sm90_accepts(q, fp8[:, 8:584], out)  # base pointer 8 bytes off
    assert accepts(InputClass(torch.bfloat16, torch.float8_e4m3fn, True))
    assert accepts(InputClass(torch.float16, torch.float8_e4m3fn, True))
    assert not accepts(InputClass(torch.bfloat16, torch.float8_e4m3fn, False))


def test_auto_uses_triton_where_the_cutlass_headers_are_missing(monkeypatch, fresh_dispatch):
    from ddtree_op import backends, build

    monkeypatch.setattr(backends, "sm90_kernel_available", lambda device: True)
    monkeypatch.setattr(build, "cutlass_headers_available", lambda: True)
    assert backends.auto_cuda_backend(torch.device("cuda")) == "sm90"
    monkeypatch.setattr(build, "cutlass_headers_available", lambda: False)
    with pytest.warns(UserWarning, match="nvidia-cutlass"):
        assert backends.auto_cuda_backend(torch.device("cuda")) == "triton"
    monkeypatch.setenv(backends.DISABLE_SM90_ENV, "1")
    monkeypatch.setattr(build, "cutlass_headers_available", lambda: True)
    fresh_dispatch()  # the environment is read once per process
    assert backends.auto_cuda_backend(torch.device("cuda")) == "triton"


def test_cutlass_is_a_deprecated_name_of_sm90(fresh_dispatch):
    from ddtree_op import backends

    with pytest.warns(FutureWarning, match="'cutlass' is deprecated"):
        assert backends.canonical_backend("cutlass") == "sm90"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.canonical_backend("cutlass") == "sm90"  # once per process


def test_cpu_runs_the_reference_for_auto_and_reference_only():
    from ddtree_op import backends

    cpu = backends.InputClass(torch.bfloat16, torch.bfloat16, True)
    assert backends.choose(torch.device("cpu"), "auto", cpu).name == "reference"
    assert backends.choose(torch.device("cpu"), "reference", cpu).name == "reference"
    for name in ("triton", "sm90"):
        with pytest.raises(RuntimeError, match=f"'{name}' needs CUDA tensors"):
            backends.choose(torch.device("cpu"), name, cpu)


def test_backend_choice_is_made_once_per_input_class(fresh_dispatch, monkeypatch):
    from ddtree_op import backends, mla_tree_verify
    from ddtree_op.synthetic import make_verify_batch

    vb = make_verify_batch([6, 3], [3, 2], 2, pad_rows=1)
    mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    first = backends.choose.cache_info()
    monkeypatch.setattr(backends, "REGISTRY", {})  # a second choice would fail
    for _ in range(3):
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    again = backends.choose.cache_info()
    assert (again.misses, again.hits) == (first.misses, first.hits + 3)


def test_combines_launch_plainly_where_the_chain_is_off(monkeypatch):
    """The combines are dependent launches only on sm_90+ with DDTREE_PDL unset, never under the
    Triton interpreter (which has no griddepcontrol); the switch is read at every call."""
    from ddtree_op.backends import splits

    device = torch.device("cuda", 0)
    monkeypatch.setenv("DDTREE_PDL", "0")
    assert not splits.dependent_launch(device)
    monkeypatch.delenv("DDTREE_PDL")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not splits.dependent_launch(device)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(splits, "_has_dependent_launch", lambda index: index == 0)
    assert splits.dependent_launch(device)
    assert not splits.dependent_launch(torch.device("cuda", 1))
