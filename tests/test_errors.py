"""Malformed calls raise errors that name the argument (eager and under torch.compile), and the
value checks of check_verify_inputs (also automatic under DDTREE_CHECK=1)."""

import pytest
import torch

from conftest import needs_cuda
from ddtree_op import check_verify_inputs, mla_tree_verify
from ddtree_op.synthetic import make_verify_batch


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def vb(request):
    return make_verify_batch([6, 3], [3, 2], 2, pad_rows=1, device=request.param)


def _empty(vb, *shape, dtype=None):
    return torch.empty(*shape, dtype=dtype or vb.q.dtype, device=vb.q.device)


def _packed(vb, dtype=torch.uint8, shape=None):
    mask = torch.ones(shape or (vb.q.shape[0],), dtype=dtype, device=vb.q.device)
    return dict(mask_layout="packed", mask_indptr=None, tree_mask=mask)


def _strided_last_dim(vb):
    wide = torch.zeros(vb.q.shape[0], vb.q.shape[1], 2 * 576, dtype=vb.q.dtype, device=vb.q.device)
    return wide[..., ::2]  # [T, H, 576] with last-dim stride 2


META = torch.device("meta")

# (argument named in the error, what is wrong, overrides of the valid call)
MALFORMED = [
    ("q", "dtype", lambda vb: dict(q=vb.q.float())),
    ("q", "last dim", lambda vb: dict(q=vb.q[:, :, :512])),
    ("q", "ndim", lambda vb: dict(q=vb.q[0])),
    ("q", "no heads", lambda vb: dict(q=vb.q[:, :0])),
    ("q", "last dim not contiguous", lambda vb: dict(q=_strided_last_dim(vb))),
    ("kv_cache", "dtype differs from q", lambda vb: dict(kv_cache=vb.kv_cache.half())),
    ("kv_cache", "last dim", lambda vb: dict(kv_cache=vb.kv_cache[:, :512])),
    ("kv_cache", "not [S, 1, 576]", lambda vb: dict(kv_cache=vb.kv_cache.view(-1, 2, 288))),
    ("kv_cache", "overlapping rows", lambda vb: dict(kv_cache=vb.kv_cache.as_strided((vb.kv_cache.shape[0] // 2, 576), (288, 1)))),
    ("kv_cache", "device", lambda vb: dict(kv_cache=vb.kv_cache.to(META))),
    ("qo_indptr", "dtype", lambda vb: dict(qo_indptr=vb.qo_indptr.float())),
    ("qo_indptr", "empty", lambda vb: dict(qo_indptr=vb.qo_indptr[:0])),
    ("qo_indptr", "ndim", lambda vb: dict(qo_indptr=vb.qo_indptr.view(1, -1))),
    ("kv_indptr", "shorter than B+1", lambda vb: dict(kv_indptr=vb.kv_indptr[:2])),
    ("kv_indices", "ndim", lambda vb: dict(kv_indices=vb.kv_indices.view(1, -1))),
    ("kv_indices", "dtype", lambda vb: dict(kv_indices=vb.kv_indices.double())),
    ("out_cache_loc", "dtype", lambda vb: dict(out_cache_loc=vb.out_cache_loc.to(torch.int16))),
    ("out_cache_loc", "device", lambda vb: dict(out_cache_loc=vb.out_cache_loc.to(META))),
    ("mask_layout", "unknown layout", lambda vb: dict(mask_layout="dense")),
    ("mask_indptr", "missing for full", lambda vb: dict(mask_indptr=None)),
    ("mask_indptr", "shorter than B+1", lambda vb: dict(mask_indptr=vb.mask_indptr[:1])),
    ("mask_indptr", "dtype", lambda vb: dict(mask_indptr=vb.mask_indptr.float())),
    ("tree_mask", "float mask for full", lambda vb: dict(tree_mask=vb.tree_mask.float())),
    ("tree_mask", "bool mask for packed", lambda vb: _packed(vb, torch.bool)),
    ("tree_mask", "2-D packed mask", lambda vb: _packed(vb, torch.int64, (vb.q.shape[0], 1))),
    ("max_draft_len", "packed mask too narrow", lambda vb: dict(_packed(vb, torch.uint8), max_draft_len=9)),
    ("max_draft_len", "not positive", lambda vb: dict(max_draft_len=0)),
    ("sm_scale", "NaN", lambda vb: dict(sm_scale=float("nan"))),
    ("sm_scale", "a string", lambda vb: dict(sm_scale="0.1")),
    ("out", "shape", lambda vb: dict(out=_empty(vb, vb.q.shape[0], 2, 256))),
    ("out", "last dim not contiguous", lambda vb: dict(out=_empty(vb, vb.q.shape[0], 2, 1024)[..., ::2])),
    ("out", "dtype", lambda vb: dict(out=_empty(vb, vb.q.shape[0], 2, 512, dtype=torch.float32))),
    ("out", "device", lambda vb: dict(out=torch.empty(vb.q.shape[0], 2, 512, dtype=vb.q.dtype, device=META))),
    ("lse", "dtype", lambda vb: dict(lse=_empty(vb, vb.q.shape[0], 2, dtype=torch.float16))),
    ("lse", "shape", lambda vb: dict(lse=_empty(vb, vb.q.shape[0], 3, dtype=torch.float32))),
    ("backend", "unknown backend", lambda vb: dict(backend="fastest")),
]
IDS = [f"{arg}-{what.replace(' ', '_')}" for arg, what, _ in MALFORMED]


def _call(vb, overrides):
    kwargs = vb.kwargs()
    q = overrides.pop("q", vb.q)
    kv_cache = overrides.pop("kv_cache", vb.kv_cache)
    kwargs.update(overrides)
    return mla_tree_verify(q, kv_cache, **kwargs)


@pytest.mark.parametrize("argument,what,override", MALFORMED, ids=IDS)
def test_malformed_call_names_the_argument(vb, argument, what, override):
    with pytest.raises((ValueError, RuntimeError), match=f"argument '{argument}'"):
        _call(vb, override(vb))


@pytest.mark.parametrize("argument,what,override", MALFORMED[::3], ids=IDS[::3])
def test_malformed_call_fails_at_trace_under_compile(vb, argument, what, override):
    torch._dynamo.reset()
    compiled = torch.compile(lambda overrides: _call(vb, overrides), fullgraph=True, backend="aot_eager")
    # Dynamo reports the user's error (a RuntimeError subclass) with the original message.
    with pytest.raises((ValueError, RuntimeError), match=f"argument '{argument}'"):
        compiled(override(vb))


def test_at_least_25_distinct_malformed_calls():
    assert len({(a, w) for a, w, _ in MALFORMED}) >= 25


VALUE_ERRORS = [
    ("qo_indptr", "not monotone", lambda vb: dict(qo_indptr=torch.tensor([0, 4, 3], device=vb.q.device))),
    ("qo_indptr", "does not start at 0", lambda vb: dict(qo_indptr=vb.qo_indptr + 1)),
    ("kv_indptr", "not monotone", lambda vb: dict(kv_indptr=torch.tensor([0, 6, 2], dtype=torch.int32, device=vb.q.device))),
    ("kv_indptr", "past the end of kv_indices", lambda vb: dict(kv_indptr=vb.kv_indptr * 10)),
    ("kv_indices", "slot out of range", lambda vb: dict(kv_indices=vb.kv_indices.clone().fill_(10**6))),
    ("out_cache_loc", "negative slots", lambda vb: dict(out_cache_loc=vb.out_cache_loc - 1000)),
    ("out_cache_loc", "shorter than qo_indptr[B]", lambda vb: dict(out_cache_loc=vb.out_cache_loc[:3])),
    ("tree_mask", "mask buffer too short", lambda vb: dict(tree_mask=vb.tree_mask[:5])),
    ("tree_mask", "packed dtype too narrow for n", lambda vb: dict(  # one request of 9 drafts, 8-bit rows
        mask_layout="packed", mask_indptr=None, tree_mask=torch.ones(9, dtype=torch.uint8, device=vb.q.device),
        qo_indptr=torch.tensor([0, 9], device=vb.q.device), out_cache_loc=torch.arange(9, device=vb.q.device),
        q=torch.randn(9, 2, 576, device=vb.q.device).to(vb.q.dtype))),
    ("q", "T_pad < qo_indptr[B]", lambda vb: dict(q=vb.q[:3])),
    ("max_draft_len", "a request has more drafts", lambda vb: dict(max_draft_len=2)),
]


@pytest.mark.parametrize("argument,what,override", VALUE_ERRORS, ids=[f"{a}-{w.replace(' ', '_')}" for a, w, _ in VALUE_ERRORS])
def test_value_checks(vb, argument, what, override, monkeypatch, fresh_dispatch):
    kwargs = vb.kwargs()
    changes = override(vb)
    q = changes.pop("q", vb.q)
    kwargs.update(changes)
    with pytest.raises(ValueError, match=f"argument '{argument}'"):
        check_verify_inputs(q, vb.kv_cache, **kwargs)
    monkeypatch.setenv("DDTREE_CHECK", "1")  # the same checks run automatically in eager mode
    fresh_dispatch()  # the environment is read once per process
    with pytest.raises(ValueError, match=f"argument '{argument}'"):
        mla_tree_verify(q, vb.kv_cache, **kwargs)


def test_valid_inputs_pass_value_checks(vb):
    check_verify_inputs(vb.q, vb.kv_cache, **vb.kwargs())


def test_cpu_rejects_gpu_only_backend():
    vb = make_verify_batch([6, 3], [3, 2], 2, pad_rows=1)
    with pytest.raises(RuntimeError, match="'triton'"):
        _call(vb, dict(backend="triton"))
