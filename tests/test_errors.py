"""Malformed calls raise errors that name the argument; value checks under DDTREE_CHECK=1."""

import pytest
import torch

from ddtree_op import check_verify_inputs, mla_tree_verify
from ddtree_op.synthetic import make_verify_batch


def _call(vb, **overrides):
    kwargs = vb.kwargs()
    q = overrides.pop("q", vb.q)
    kv_cache = overrides.pop("kv_cache", vb.kv_cache)
    kwargs.update(overrides)
    return mla_tree_verify(q, kv_cache, **kwargs)


@pytest.fixture
def vb():
    return make_verify_batch([6, 3], [3, 2], 2, pad_rows=1)


MALFORMED = [
    ("q", lambda vb: dict(q=vb.q.float())),  # dtype
    ("q", lambda vb: dict(q=vb.q[:, :, :512])),  # last dim
    ("q", lambda vb: dict(q=vb.q[0])),  # ndim
    ("kv_cache", lambda vb: dict(kv_cache=vb.kv_cache.half())),  # dtype differs from q
    ("kv_cache", lambda vb: dict(kv_cache=vb.kv_cache[:, :512])),  # last dim
    ("kv_cache", lambda vb: dict(kv_cache=vb.kv_cache.view(-1, 2, 288))),  # not [S, 1, 576]
    ("qo_indptr", lambda vb: dict(qo_indptr=vb.qo_indptr.float())),  # dtype
    ("qo_indptr", lambda vb: dict(qo_indptr=vb.qo_indptr[:0])),  # empty
    ("kv_indptr", lambda vb: dict(kv_indptr=vb.kv_indptr[:2])),  # shorter than B+1
    ("kv_indices", lambda vb: dict(kv_indices=vb.kv_indices.view(1, -1))),  # ndim
    ("out_cache_loc", lambda vb: dict(out_cache_loc=vb.out_cache_loc.to(torch.int16))),  # dtype
    ("mask_layout", lambda vb: dict(mask_layout="dense")),  # unknown layout
    ("mask_indptr", lambda vb: dict(mask_indptr=None)),  # required for "full"
    ("tree_mask", lambda vb: dict(tree_mask=vb.tree_mask.float())),  # dtype for "full"
    ("tree_mask", lambda vb: dict(mask_layout="packed", tree_mask=vb.tree_mask.float())),  # dtype for "packed"
    ("sm_scale", lambda vb: dict(sm_scale=float("nan"))),
    ("out", lambda vb: dict(out=torch.empty(vb.q.shape[0], 2, 256, dtype=vb.q.dtype))),
    ("lse", lambda vb: dict(lse=torch.empty(vb.q.shape[0], 2, dtype=torch.float16))),
    ("backend", lambda vb: dict(backend="fastest")),
]


@pytest.mark.parametrize("argument,override", MALFORMED, ids=[f"{a}-{i}" for i, (a, _) in enumerate(MALFORMED)])
def test_malformed_call_names_the_argument(vb, argument, override):
    with pytest.raises((ValueError, RuntimeError), match=f"'{argument}'"):
        _call(vb, **override(vb))


VALUE_ERRORS = [
    ("qo_indptr", lambda vb: dict(qo_indptr=torch.tensor([0, 4, 3]))),  # not monotone
    ("kv_indices", lambda vb: dict(kv_indices=vb.kv_indices.clone().fill_(10**6))),  # slot out of range
    ("out_cache_loc", lambda vb: dict(out_cache_loc=vb.out_cache_loc - 100)),  # negative slots
    ("tree_mask", lambda vb: dict(tree_mask=vb.tree_mask[:5])),  # mask buffer too short
    ("q", lambda vb: dict(q=vb.q[:3])),  # T_pad < qo_indptr[B]
]


@pytest.mark.parametrize("argument,override", VALUE_ERRORS, ids=[a for a, _ in VALUE_ERRORS])
def test_value_checks(vb, argument, override, monkeypatch):
    kwargs = vb.kwargs()
    changes = override(vb)
    q = changes.pop("q", vb.q)
    kwargs.update(changes)
    with pytest.raises(ValueError, match=f"'{argument}'"):
        check_verify_inputs(q, vb.kv_cache, **kwargs)
    monkeypatch.setenv("DDTREE_CHECK", "1")  # the same checks run automatically in eager mode
    with pytest.raises(ValueError, match=f"'{argument}'"):
        mla_tree_verify(q, vb.kv_cache, **kwargs)


def test_valid_inputs_pass_value_checks(vb):
    check_verify_inputs(vb.q, vb.kv_cache, **vb.kwargs())


def test_cpu_rejects_gpu_only_backend(vb):
    with pytest.raises(RuntimeError, match="'triton'"):
        _call(vb, backend="triton")
