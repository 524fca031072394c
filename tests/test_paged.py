"""Paged KV (`mla_tree_verify_paged`): the preparation against the slot-list preparation, the
whole step against an independent float64 brute force, bad page ids and lengths, opcheck,
compile; on a GPU both kernels against the reference and CUDA-graph replay with new tables."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import needs_cuda, relative_error
from gpu_cases import assert_matches_reference, capture, cuda_backends
from ddtree_op import mla_tree_verify_paged, ops
from ddtree_op.api import mask_words_per_row
from ddtree_op.paged import paged_verify_len, prepare_paged
from ddtree_op.synthetic_paged import dequantized_pool, make_paged_batch

LAYOUTS = ("full", "qlen", "packed")
# (prefix lengths, draft lengths, page size): ragged, P = 0, empty requests, drafts straddling a
# page boundary (60 + 8 over 64, 13 + 6 over 16), a request of exactly one page.
CASES = [
    ([60, 0, 130], [8, 3, 5], 64),
    ([13, 47, 0, 200], [6, 1, 4, 16], 16),
    ([0], [5], 16),
    ([5, 0, 70], [3, 0, 9], 16),
    ([56], [8], 64),
    ([250, 3], [16, 2], 64),
]


def brute_force_paged(pb):
    """float64 straight from the paged inputs, one (row, head) at a time: positions through the
    block table, the raw mask layout, the dequantized rows; a page id out of range hides the key,
    a request whose length does not fit sees nothing."""
    q = pb.q.double().cpu()
    pool = dequantized_pool(pb.kv_cache.cpu(), pb.kv_scale)
    ps = pb.page_size
    num_pages = pb.kv_cache.shape[0]
    table = pb.block_table.cpu()
    qo = pb.qo_indptr.tolist()
    seqlens = pb.cache_seqlens.tolist()
    mask = pb.tree_mask.cpu()
    mask_indptr = None if pb.mask_indptr is None else pb.mask_indptr.tolist()
    tokens, heads = q.shape[0], q.shape[1]
    out = torch.zeros(tokens, heads, 512, dtype=torch.float64)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64)
    qlen_start = 0
    for b in range(len(qo) - 1):
        n, length = qo[b + 1] - qo[b], seqlens[b]
        prefix = length - n
        fits = n <= length <= table.shape[1] * ps

        def slot(pos):
            page = int(table[b, pos // ps])
            return page * ps + pos % ps if 0 <= page < num_pages else None

        for i in range(n if fits else 0):
            keys = [slot(j) for j in range(prefix)]
            for j in range(n):
                if pb.mask_layout == "full":
                    seen = bool(mask[mask_indptr[b] + i * length + prefix + j])
                elif pb.mask_layout == "qlen":
                    start = mask_indptr[b] if mask_indptr is not None else qlen_start
                    seen = bool(mask[start + i * n + j])
                else:
                    seen = bool((int(mask[qo[b] + i].long()) % (1 << (mask.element_size() * 8)) >> j) & 1)
                if seen:
                    keys.append(slot(prefix + j))
            keys = [k for k in keys if k is not None]
            if not keys:
                continue
            k = pool[keys]
            for h in range(heads):
                scores = (k @ q[qo[b] + i, h]) * pb.sm_scale
                lse[qo[b] + i, h] = torch.logsumexp(scores, 0)
                out[qo[b] + i, h] = torch.softmax(scores, 0) @ k[:, :512]
        qlen_start += n * n
    return out, lse


def assert_close_to(out, lse, want_out, want_lse, tol=1e-2):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert relative_error(out.cpu(), want_out) < tol
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], want_lse[finite], atol=2e-3, rtol=1e-3)
    assert torch.all(out.cpu()[torch.isinf(want_lse)] == 0)


def _prepare(pb, words=None):
    rows = pb.q.shape[0]
    words = words or mask_words_per_row(pb.tree_mask, pb.mask_layout, rows, None)
    return prepare_paged(pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask, pb.mask_indptr, pb.mask_layout,
                         pb.page_size, pb.kv_cache.shape[0], rows, words)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-page{c[2]}")
def test_paged_prep_is_the_slot_prep_of_the_same_batch(case, layout):
    prefix, drafts, page = case
    pb = make_paged_batch(prefix, drafts, 1, page_size=page, layout=layout, pad_rows=2, seed=len(prefix))
    rows = pb.q.shape[0]
    words = mask_words_per_row(pb.tree_mask, layout, rows, None)
    verify_indptr, verify_indices, mask_words = _prepare(pb, words)[:3]
    kv_indptr, kv_indices, out_cache_loc = pb.slot_lists()
    want = ops.prepare_verify(pb.qo_indptr, kv_indptr, kv_indices, out_cache_loc, pb.tree_mask, pb.mask_indptr, layout, rows,
                              words, pb.kv_cache.shape[0] * page)
    end = int(verify_indptr[-1])
    assert torch.equal(verify_indptr, want[0])
    assert torch.equal(verify_indices[:end], want[1][:end])
    assert torch.equal(mask_words, want[2])
    assert verify_indices.numel() == paged_verify_len(len(prefix), pb.block_table.shape[1], page, rows)


@pytest.mark.parametrize("kv_dtype", ["same", "fp8", "uint8"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-page{c[2]}")
def test_reference_matches_brute_force(case, layout, kv_dtype):
    prefix, drafts, page = case
    pb = make_paged_batch(prefix, drafts, 2, page_size=page, layout=layout, kv_dtype=kv_dtype, pad_rows=2,
                          seed=page + len(prefix), kv_cache_3d=len(prefix) % 2 == 1)
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    assert_close_to(out, lse, *brute_force_paged(pb))


def test_kv_scale_tensor_is_read_on_the_device():
    pb = make_paged_batch([40, 9], [5, 3], 2, page_size=16, kv_dtype="fp8", kv_scale=0.02, kv_scale_tensor=True)
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    assert_close_to(out, lse, *brute_force_paged(pb))
    pb.kv_scale.fill_(0.07)  # same tensor, new value: what a captured step sees between replays
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    assert_close_to(out, lse, *brute_force_paged(pb))


def test_bad_page_ids_hide_their_keys():
    pb = make_paged_batch([100, 30], [6, 4], 2, page_size=16, seed=5)
    pb.block_table[0, 2] = pb.kv_cache.shape[0]  # one past the last page
    pb.block_table[1, 0] = -7
    pb.block_table[1, 2] = -1  # the page holding request 1's drafts 2..3
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    assert_close_to(out, lse, *brute_force_paged(pb))
    verify_indptr, verify_indices = _prepare(pb)[:2]
    assert int((verify_indices[: int(verify_indptr[-1])] == -1).sum()) == 16 + 16 + 2


def test_status_records_bad_pages_and_lengths():
    from ddtree_op import decode_status, new_status

    pb = make_paged_batch([100, 30], [6, 4], 2, page_size=16, seed=5)
    status = new_status()
    mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), status=status, backend="reference")
    assert decode_status(status) == []
    pb.block_table[0, 1] = -2  # a prefix page
    mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), status=status, backend="reference")
    assert [kind for kind, _, _ in decode_status(status)] == ["kv_slot"]
    pb.cache_seqlens[1] = 2  # fewer positions than drafts: the drafts' slots are -1
    mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), status=status, backend="reference")
    assert [kind for kind, _, _ in decode_status(status)] == ["kv_slot", "draft_slot"]


@pytest.mark.parametrize("seqlen", [3, 10_000])  # fewer positions than drafts; more than the table holds
def test_request_whose_length_does_not_fit_sees_nothing(seqlen):
    pb = make_paged_batch([20, 30], [5, 4], 2, page_size=16, seed=2, pad_rows=1)
    pb.cache_seqlens[1] = seqlen
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    want_out, want_lse = brute_force_paged(pb)
    assert torch.isinf(want_lse[5:]).all()
    assert_close_to(out, lse, want_out, want_lse)


@pytest.mark.parametrize("change,message", [
    (lambda pb: pb.block_table.__setitem__((1, 0), -1), r"block_table\[1, 0\] = -1"),
    (lambda pb: pb.block_table.__setitem__((0, 1), 99), r"block_table\[0, 1\] = 99"),
    (lambda pb: pb.cache_seqlens.__setitem__(1, 3), r"cache_seqlens\[1\] = 3"),
    (lambda pb: pb.cache_seqlens.__setitem__(0, 10_000), r"cache_seqlens\[0\] = 10000"),
    (lambda pb: pb.qo_indptr.__setitem__(1, 10), "qo_indptr"),
    (lambda pb: pb.mask_indptr.__setitem__(1, 10_000), "mask_indptr"),
])
def test_check_paged_inputs_names_the_bad_value(change, message, monkeypatch):
    from ddtree_op.paged import check_paged_inputs

    pb = make_paged_batch([20, 30], [5, 4], 2, page_size=16, extra_columns=0, pad_rows=2)
    check_paged_inputs(pb.q, pb.kv_cache, **pb.kwargs())
    change(pb)
    with pytest.raises(ValueError, match=message):
        check_paged_inputs(pb.q, pb.kv_cache, **pb.kwargs())
    monkeypatch.setattr("ddtree_op.paged._eager_checks_enabled", lambda: True)  # what DDTREE_CHECK=1 does
    with pytest.raises(ValueError, match=message):
        mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs())


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_table_rows_past_the_batch_and_out_buffers(index_dtype):
    pb = make_paged_batch([33, 64], [4, 8], 3, page_size=64, table_rows=7, pad_rows=3, seed=4)
    pb.block_table, pb.cache_seqlens = pb.block_table.to(index_dtype), pb.cache_seqlens.to(index_dtype)
    pb.qo_indptr = pb.qo_indptr.to(index_dtype)
    out = torch.full((pb.q.shape[0], 3, 512), float("nan")).to(pb.q.dtype)
    lse = torch.full((pb.q.shape[0], 3), float("nan"))
    got = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=out, lse=lse, max_draft_len=8, backend="reference")
    assert got[0] is out and got[1] is lse
    assert_close_to(out, lse, *brute_force_paged(pb))


@pytest.mark.parametrize("name,change,message", [
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"][:, :, :, :500]), "kv_cache"),
    ("block_table", lambda a: a.update(block_table=a["block_table"].float()), "block_table"),
    ("block_table rows", lambda a: a.update(block_table=a["block_table"][:1]), "block_table"),
    ("cache_seqlens", lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), "cache_seqlens"),
    ("kv_scale on bf16", lambda a: a.update(kv_scale=0.5), "kv_scale"),
    ("page stride", lambda a: a.update(kv_cache=a["kv_cache"][::2]), "kv_cache"),
    ("page size", lambda a: a.update(kv_cache=a["kv_cache"][:, :8]), "kv_cache"),
    ("fp32 cache", lambda a: a.update(kv_cache=a["kv_cache"].float()), "kv_cache"),
    ("seqlens device", lambda a: a.update(cache_seqlens=a["cache_seqlens"].to("meta")), "cache_seqlens"),
])
def test_errors_name_the_argument(name, change, message):
    pb = make_paged_batch([20, 30], [5, 4], 2, page_size=16)
    args = dict(kv_cache=pb.kv_cache, **pb.kwargs())
    change(args)
    with pytest.raises((ValueError, RuntimeError), match=message):
        mla_tree_verify_paged(pb.q, **args)


def test_opcheck_paged_slot_lists():
    for i, (prefix, drafts, page) in enumerate(CASES):
        pb = make_paged_batch(prefix, drafts, 1, page_size=page, pad_rows=i, seed=i)
        pb.block_table[0, 0] = -3  # a bad page id: slot -1
        torch.library.opcheck(ops.paged_slot_lists, (pb.block_table, pb.cache_seqlens, pb.qo_indptr, page,
                                                    pb.kv_cache.shape[0], pb.q.shape[0]))


def paged_step(q, kv_cache, block_table, cache_seqlens, qo_indptr, tree_mask, mask_indptr):
    out, lse = mla_tree_verify_paged(q, kv_cache, block_table=block_table, cache_seqlens=cache_seqlens,
                                     qo_indptr=qo_indptr, tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=0.1352)
    return out * 2, lse + 1


def _step_inputs(pb):
    return (pb.q, pb.kv_cache, pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask, pb.mask_indptr)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_fullgraph_one_frame_no_recompile(device):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(paged_step, backend=counter, fullgraph=True)
    for i, (prefix, drafts) in enumerate([([20, 7], [4, 6]), ([33, 2], [9, 8]), ([5, 11, 40], [8, 8, 8])]):
        pb = make_paged_batch(prefix, drafts, 2, page_size=16, device=device, pad_rows=2, seed=i, extra_columns=4 - i)
        args = _step_inputs(pb)
        for t in args:
            torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(pb.block_table, 1)  # the table's width changes too
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            out, lse = compiled(*args)
        want_out, want_lse = paged_step(*args)
        assert relative_error(out, want_out) < 1e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert counter.frame_count == 1


def test_explain_reports_no_graph_break():
    pb = make_paged_batch([10, 3], [5, 2], 2, page_size=16, pad_rows=1)
    explanation = torch._dynamo.explain(paged_step)(*_step_inputs(pb))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


# ---------------------------------------------------------------- GPU


def _cuda_backends():
    return cuda_backends()


GPU_BACKENDS = _cuda_backends() if torch.cuda.is_available() else ["triton"]


@needs_cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-page{c[2]}")
def test_cuda_prep_matches_cpu(case, layout):
    prefix, drafts, page = case
    pb = make_paged_batch(prefix, drafts, 1, page_size=page, layout=layout, pad_rows=2, seed=3, device="cuda")
    got = _prepare(pb)
    cpu = make_paged_batch(prefix, drafts, 1, page_size=page, layout=layout, pad_rows=2, seed=3)
    want = _prepare(cpu)
    end = int(want[0][-1])
    assert torch.equal(got[0].cpu(), want[0])
    assert torch.equal(got[1][:end].cpu(), want[1][:end])
    assert torch.equal(got[2].cpu(), want[2])


def _large_paged_batch(batch, seed, heads=1):
    prefix = [(7 * b) % 40 for b in range(batch)]
    drafts = [1 + b % 3 for b in range(batch)]
    return make_paged_batch(prefix, drafts, heads, page_size=16, layout="packed", pad_rows=5, seed=seed)


@needs_cuda
# Around the one-launch slot lists (<= 1024 requests; above, the scan launch first) and the
# staged preparation (<= 1023; above, its one-block pass first).
@pytest.mark.parametrize("batch", [1023, 1024, 1025, 3000, 4096, 65536])
def test_cuda_prep_large_batches_match_cpu(batch):
    import ddtree_op

    pb = _large_paged_batch(batch, batch)
    pb.block_table[batch // 2, 0] = -1
    pb.cache_seqlens[batch - 1] = 0
    want_status, got_status = ddtree_op.new_status(), ddtree_op.new_status("cuda")
    rows, pages = pb.q.shape[0], pb.kv_cache.shape[0]
    want = prepare_paged(pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask, None, "packed", 16, pages, rows, 1,
                         status=want_status)
    args = [t.cuda() for t in (pb.block_table, pb.cache_seqlens, pb.qo_indptr, pb.tree_mask)]
    got = prepare_paged(*args, None, "packed", 16, pages, rows, 1, status=got_status)
    end = int(want[0][-1])
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1][:end].cpu(), want[1][:end])
    assert torch.equal(got[2].cpu(), want[2]) and torch.equal(got[3].cpu(), want[3])
    assert torch.equal(got_status.cpu(), want_status) and ddtree_op.decode_status(want_status)[0][0] == "kv_slot"


@needs_cuda
@pytest.mark.parametrize("batch", [1023, 1024, 1025, 4096])
def test_paged_step_large_batches_match_reference(batch):
    """`mla_tree_verify_paged` on CUDA against the CPU reference, with a status: clean, then with a
    page id out of range in the last request (the same status as the CPU, its key hidden)."""
    import ddtree_op

    pb = _large_paged_batch(batch, 7, heads=2)
    for bad in (False, True):
        if bad:
            pb.block_table[batch - 1, 0] = pb.kv_cache.shape[0]
        kw = dict(block_table=pb.block_table, cache_seqlens=pb.cache_seqlens, qo_indptr=pb.qo_indptr, tree_mask=pb.tree_mask,
                  mask_layout="packed", sm_scale=pb.sm_scale)
        want_status = ddtree_op.new_status()
        ref_out, ref_lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **kw, backend="reference", status=want_status)
        assert bool(want_status[0]) == bad
        gpu_kw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        for backend in GPU_BACKENDS:
            status = ddtree_op.new_status("cuda")
            out, lse = mla_tree_verify_paged(pb.q.cuda(), pb.kv_cache.cuda(), **gpu_kw, backend=backend, status=status)
            assert_close_to(out, lse, ref_out.double(), ref_lse.double())
            assert torch.equal(status.cpu(), want_status), (backend, status.tolist(), want_status.tolist())


@needs_cuda
def test_cuda_prep_bad_pages_and_lengths_match_cpu():
    for seqlen in (3, 10_000, 25):
        pb = make_paged_batch([100, 30, 7], [6, 4, 2], 1, page_size=16, seed=5, pad_rows=2)
        pb.block_table[0, 2] = pb.kv_cache.shape[0]
        pb.block_table[1, 0] = -7
        pb.cache_seqlens[2] = seqlen
        want = _prepare(pb)
        gpu = make_paged_batch([100, 30, 7], [6, 4, 2], 1, page_size=16, seed=5, pad_rows=2, device="cuda")
        gpu.block_table.copy_(pb.block_table)
        gpu.cache_seqlens.copy_(pb.cache_seqlens)
        got = _prepare(gpu)
        end = int(want[0][-1])
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1][:end].cpu(), want[1][:end])
        assert torch.equal(got[2].cpu(), want[2])


def _gpu_grid():
    """q_len 1..256 and P up to 128k, pages of 64 (the fast path) and 16."""
    yield [0], [1], 64, 16
    yield [127], [1], 64, 128
    yield [4000, 100, 0, 64], [4, 1, 3, 2], 64, 16
    yield [1000, 3000], [16, 16], 16, 16
    yield [63, 129], [64, 64], 64, 16
    yield [8192], [256], 64, 16
    yield [131072], [16], 64, 16
    yield [131072, 2048], [4, 64], 64, 128
    yield [65536] * 4, [8] * 4, 64, 16


@needs_cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("kv_dtype", ["same", "fp8", "uint8"])
@pytest.mark.parametrize("layout", ["full", "packed"])
@pytest.mark.parametrize("case", list(_gpu_grid()), ids=lambda c: f"P{c[0][:2]}-n{c[1][:2]}-page{c[2]}-H{c[3]}")
def test_kernels_match_reference(case, layout, kv_dtype, backend):
    prefix, drafts, page, heads = case
    if max(prefix) >= 65536 and (layout != "full" or kv_dtype == "uint8"):
        pytest.skip("long prefixes: one layout and one FP8 storage are enough (device time)")
    if layout == "packed" and max(drafts) > 64:
        layout = "qlen"
    pb = make_paged_batch(prefix, drafts, heads, page_size=page, layout=layout, kv_dtype=kv_dtype, pad_rows=3, seed=11,
                          device="cuda")
    ref_out, ref_lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend="reference")
    out, lse = mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), backend=backend)
    assert_matches_reference(out, lse, ref_out, ref_lse)


@needs_cuda
@pytest.mark.parametrize("backend", ["auto"] + GPU_BACKENDS)
@pytest.mark.parametrize("kv_dtype", ["same", "fp8"])
def test_graph_replay_with_new_tables_lengths_trees_and_scale(backend, kv_dtype):
    """One capture, then new block tables (other pages, other lengths), new trees and a new
    kv_scale written into the same buffers; every replay against the reference."""
    heads, page, rows, max_pages, batch, num_pages = 16, 64, 40, 48, 3, 300
    steps = [([900, 37, 0], [8, 5, 3]), ([64, 2000, 511], [1, 16, 9]), ([2400, 1, 63], [2, 2, 2])]

    def spare_pages(prefix, drafts):  # every step's pool has num_pages pages
        return num_pages - sum(-(-(p + n) // page) for p, n in zip(prefix, drafts))

    first = make_paged_batch(*steps[0], heads, page_size=page, kv_dtype=kv_dtype, kv_scale_tensor=True, device="cuda",
                             extra_pages=spare_pages(*steps[0]), seed=0)
    kv_cache = first.kv_cache
    q = torch.zeros(rows, heads, 576, dtype=torch.bfloat16, device="cuda")
    table = torch.zeros(batch, max_pages, dtype=torch.int32, device="cuda")
    seqlens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    qo = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    mask = torch.zeros(rows * (2500 + rows), dtype=torch.bool, device="cuda")
    mask_indptr = torch.zeros(batch + 1, dtype=torch.int64, device="cuda")
    scale = torch.ones(1, dtype=torch.float32, device="cuda") if kv_dtype == "fp8" else None
    out = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")

    def step():
        mla_tree_verify_paged(q, kv_cache, block_table=table, cache_seqlens=seqlens, qo_indptr=qo, tree_mask=mask,
                              mask_indptr=mask_indptr, sm_scale=first.sm_scale, kv_scale=scale, out=out, lse=lse,
                              backend=backend)

    def load(pb):
        q.zero_()
        q[: pb.q.shape[0]] = pb.q
        table.zero_()
        table[:, : pb.block_table.shape[1]] = pb.block_table
        seqlens.copy_(pb.cache_seqlens)
        qo.copy_(pb.qo_indptr)
        mask[: pb.tree_mask.numel()] = pb.tree_mask
        mask_indptr.copy_(pb.mask_indptr)
        if scale is not None:
            scale.copy_(pb.kv_scale)

    load(first)
    graph, _ = capture(step)
    for i, (prefix, drafts) in enumerate(steps):
        pb = make_paged_batch(prefix, drafts, heads, page_size=page, kv_dtype=kv_dtype, kv_scale=0.03 + 0.02 * i,
                              kv_scale_tensor=True, device="cuda", extra_pages=spare_pages(prefix, drafts), seed=i + 1)
        pb.kv_cache = kv_cache  # the same pool: other pages, other positions
        if kv_dtype == "fp8":
            pb.kv_scale = torch.tensor([0.03 + 0.02 * i], device="cuda")
        load(pb)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = mla_tree_verify_paged(q, kv_cache, block_table=table, cache_seqlens=seqlens, qo_indptr=qo,
                                                 tree_mask=mask, mask_indptr=mask_indptr, sm_scale=first.sm_scale,
                                                 kv_scale=scale, backend="reference")
        assert not torch.isnan(out).any()
        assert relative_error(out, ref_out) < 2e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))


def test_any_batch_size_passes_the_shape_checks():
    """No batch cap on any device (the CUDA preparation takes any B); only int32 positions bound
    qo_indptr's length. Meta tensors: shapes only, no memory."""
    from ddtree_op.checks import check_verify_shapes

    def shapes(entries):
        meta = dict(device="meta")
        q = torch.empty(8, 1, 576, dtype=torch.bfloat16, **meta)
        kv = torch.empty(64, 576, dtype=torch.bfloat16, **meta)
        qo = torch.empty(entries, dtype=torch.int32, **meta)
        mask = torch.empty(8, dtype=torch.uint8, **meta)
        check_verify_shapes(q, kv, qo, qo, qo, qo, mask, None, 0.1, "packed")

    for batch in (1023, 1024, 65536, 2**20):
        shapes(batch + 1)
    with pytest.raises(ValueError, match="qo_indptr"):
        shapes(2**31)
