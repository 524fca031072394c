"""The verify step in two halves: `prepare_tree_verify` (or `_paged`) once, then
`mla_tree_verify_prepared` for each layer. Each layer's result is the one-call step's, bit for
bit, on every backend of the machine; wrong shapes name their argument; the status is published
by the preparation; the halves compile and replay in a CUDA graph."""

import pytest
import torch

from conftest import needs_cuda
from gpu_cases import assert_matches_reference, capture, cuda_backends
from ddtree_op import (PreparedVerify, mla_tree_verify, mla_tree_verify_paged, mla_tree_verify_prepared, new_status,
                       prepare_tree_verify, prepare_tree_verify_paged, raise_on_status)
from ddtree_op.synthetic import make_verify_batch
from ddtree_op.synthetic_paged import make_paged_batch

DEVICES = [("cpu", "reference")] + ([("cuda", b) for b in cuda_backends()] if torch.cuda.is_available() else [])
LAYERS = 3


def layer_inputs(q, kv_cache, layers, seed):
    """Each layer's own q and KV pool (fresh random values, the shapes of the batch's)."""
    gen = torch.Generator(device=q.device).manual_seed(seed)
    return [(torch.randn(q.shape, generator=gen, device=q.device).to(q.dtype),
             torch.randn(kv_cache.shape, generator=gen, device=q.device).to(kv_cache.dtype)) for _ in range(layers)]


def prepare_kwargs(vb):
    kwargs = vb.kwargs()
    del kwargs["sm_scale"]
    return kwargs


@pytest.mark.parametrize("device,backend", DEVICES)
@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_each_layer_is_the_one_call_step(device, backend, layout):
    vb = make_verify_batch([300, 0, 77], [6, 9, 1], 16, device=device, layout=layout, pad_rows=2, seed=3)
    prepared = prepare_tree_verify(vb.q, vb.kv_cache, **prepare_kwargs(vb), max_draft_len=16)
    assert isinstance(prepared, PreparedVerify)
    for q, kv in layer_inputs(vb.q, vb.kv_cache, LAYERS, seed=5):
        out, lse = mla_tree_verify_prepared(q, kv, prepared, sm_scale=vb.sm_scale, backend=backend)
        want_out, want_lse = mla_tree_verify(q, kv, **vb.kwargs(), max_draft_len=16, backend=backend)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
        assert torch.isfinite(lse[: sum(vb.draft_lens)]).all() and torch.isinf(lse[sum(vb.draft_lens):]).all()


@pytest.mark.parametrize("device,backend", DEVICES)
def test_each_layer_is_the_one_call_paged_step(device, backend):
    pb = make_paged_batch([130, 5, 64], [4, 7, 2], 16, page_size=64, device=device, pad_rows=1, seed=4)
    kwargs = pb.kwargs()
    del kwargs["sm_scale"], kwargs["kv_scale"]
    prepared = prepare_tree_verify_paged(pb.q, pb.kv_cache, **kwargs)
    assert prepared.page_size == 64
    for q, kv in layer_inputs(pb.q, pb.kv_cache, LAYERS, seed=6):
        out, lse = mla_tree_verify_prepared(q, kv, prepared, sm_scale=pb.sm_scale, backend=backend)
        want_out, want_lse = mla_tree_verify_paged(q, kv, **pb.kwargs(), backend=backend)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_into_given_buffers():
    vb = make_verify_batch([40, 9], [5, 7], 2, seed=1)
    prepared = prepare_tree_verify(vb.q, vb.kv_cache, **prepare_kwargs(vb))
    out = torch.full((12, 2, 512), float("nan"), dtype=vb.q.dtype)
    lse = torch.full((12, 2), float("nan"))
    got = mla_tree_verify_prepared(vb.q, vb.kv_cache, prepared, sm_scale=vb.sm_scale, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    want_out, want_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs())
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_shapes_other_than_prepared_name_their_argument():
    vb = make_verify_batch([40, 9], [5, 7], 4, seed=2)
    prepared = prepare_tree_verify(vb.q, vb.kv_cache, **prepare_kwargs(vb))
    call = dict(sm_scale=vb.sm_scale)
    with pytest.raises(ValueError, match=r"argument 'q' must be \[12, 4, 576\]"):
        mla_tree_verify_prepared(vb.q[:, :2], vb.kv_cache, prepared, **call)
    with pytest.raises(ValueError, match=r"argument 'q' must be \[12, 4, 576\]"):
        mla_tree_verify_prepared(vb.q[:10], vb.kv_cache, prepared, **call)
    with pytest.raises(ValueError, match="argument 'kv_cache' must be a pool of"):
        mla_tree_verify_prepared(vb.q, vb.kv_cache[:-1], prepared, **call)
    with pytest.raises(ValueError, match="argument 'prepared' must be a PreparedVerify"):
        mla_tree_verify_prepared(vb.q, vb.kv_cache, tuple(prepared)[:5], **call)
    with pytest.raises(ValueError, match="argument 'sm_scale'"):
        mla_tree_verify_prepared(vb.q, vb.kv_cache, prepared, sm_scale=float("nan"))
    with pytest.raises(ValueError, match="argument 'out'"):
        mla_tree_verify_prepared(vb.q, vb.kv_cache, prepared, out=torch.empty(12, 4, 511, dtype=vb.q.dtype), **call)
    with pytest.raises(ValueError, match="argument 'tree_mask'"):
        prepare_tree_verify(vb.q, vb.kv_cache, **dict(prepare_kwargs(vb), tree_mask=vb.tree_mask.float()))
    pb = make_paged_batch([100], [3], 4, page_size=32, seed=3)
    kwargs = pb.kwargs()
    del kwargs["sm_scale"], kwargs["kv_scale"]
    paged = prepare_tree_verify_paged(pb.q, pb.kv_cache, **kwargs)
    with pytest.raises(ValueError, match="argument 'kv_cache' must be"):
        mla_tree_verify_prepared(pb.q, pb.kv_cache.flatten(0, 1), paged, **call)  # a token pool for a paged step


@pytest.mark.parametrize("device,backend", DEVICES)
def test_the_preparation_publishes_the_status(device, backend):
    vb = make_verify_batch([40, 9], [5, 7], 2, device=device, seed=6)
    vb.kv_indices[3] = vb.kv_cache.shape[0] + 5  # one prefix slot past the pool
    status = new_status(torch.device(device))
    prepared = prepare_tree_verify(vb.q, vb.kv_cache, **prepare_kwargs(vb), status=status)
    for q, kv in layer_inputs(vb.q, vb.kv_cache, 2, seed=7):
        out, lse = mla_tree_verify_prepared(q, kv, prepared, sm_scale=vb.sm_scale, backend=backend)
        want_out, _ = mla_tree_verify(q, kv, **vb.kwargs(), backend=backend)
        assert torch.equal(out, want_out) and not torch.isnan(out).any()
    with pytest.raises(ValueError, match=r"kv_indices\[3\]"):
        raise_on_status(status)
    vb.kv_indices[3] = 0  # the next step is clean: its preparation clears the status
    prepare_tree_verify(vb.q, vb.kv_cache, **prepare_kwargs(vb), status=status)
    raise_on_status(status)


def test_the_halves_compile_without_graph_breaks():
    torch._dynamo.reset()

    def forward(q, kv, qo, kvp, kvi, ocl, mask, mptr):
        prepared = prepare_tree_verify(q, kv, qo_indptr=qo, kv_indptr=kvp, kv_indices=kvi, out_cache_loc=ocl, tree_mask=mask,
                                       mask_indptr=mptr)
        outs = [mla_tree_verify_prepared(q * (layer + 1), kv, prepared, sm_scale=0.1352)[0] for layer in range(2)]
        return outs[0] + outs[1]

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    for seed in range(2):
        vb = make_verify_batch([30, 20], [6, 9], 4, pad_rows=1, seed=seed)
        args = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)
        assert torch.equal(compiled(*args), forward(*args))


@needs_cuda
@pytest.mark.parametrize("backend", cuda_backends())
def test_a_captured_forward_replays_with_new_batches(backend):
    """A graph of one preparation and three layers, replayed with new lengths, slots and trees
    written into the same buffers (as a serving engine's CUDA-graph runner does)."""
    heads, rows, pool = 16, 31, 60_000
    cuda = dict(device="cuda")
    qo = torch.zeros(4, dtype=torch.int64, **cuda)
    kvp = torch.zeros(4, dtype=torch.int32, **cuda)
    kvi = torch.zeros(50_000, dtype=torch.int64, **cuda)
    ocl = torch.zeros(rows, dtype=torch.int64, **cuda)
    mask = torch.zeros(2_000_000, dtype=torch.bool, **cuda)
    mptr = torch.zeros(4, dtype=torch.int64, **cuda)
    layers = [(torch.randn(rows, heads, 576, **cuda).to(torch.bfloat16), torch.randn(pool, 576, **cuda).to(torch.bfloat16))
              for _ in range(LAYERS)]
    outs = [torch.empty(rows, heads, 512, dtype=torch.bfloat16, **cuda) for _ in range(LAYERS)]
    lses = [torch.empty(rows, heads, **cuda) for _ in range(LAYERS)]
    index_kwargs = dict(qo_indptr=qo, kv_indptr=kvp, kv_indices=kvi, out_cache_loc=ocl, tree_mask=mask, mask_indptr=mptr)

    def forward():
        prepared = prepare_tree_verify(layers[0][0], layers[0][1], **index_kwargs, max_draft_len=16)
        for (q, kv), out, lse in zip(layers, outs, lses):
            mla_tree_verify_prepared(q, kv, prepared, sm_scale=0.1352, out=out, lse=lse, backend=backend)

    graph, _ = capture(forward)
    for seed, (prefix, drafts) in enumerate([([30000, 3, 9], [3, 12, 9]), ([1, 1, 1], [1, 1, 1]), ([9000, 9000, 64], [16, 4, 7])]):
        vb = make_verify_batch(prefix, drafts, heads, device="cuda", seed=seed + 21)
        assert vb.kv_cache.shape[0] <= pool
        for name, buf in (("qo_indptr", qo), ("kv_indptr", kvp), ("kv_indices", kvi), ("out_cache_loc", ocl),
                          ("tree_mask", mask), ("mask_indptr", mptr)):
            value = getattr(vb, name)
            buf.view(-1)[: value.numel()].copy_(value.reshape(-1))
        for out, lse in zip(outs, lses):
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        for (q, kv), out, lse in zip(layers, outs, lses):
            ref_out, ref_lse = mla_tree_verify(q, kv, **index_kwargs, sm_scale=0.1352, backend="reference")
            assert_matches_reference(out, lse, ref_out, ref_lse)
