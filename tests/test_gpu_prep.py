"""CUDA preparation kernels (combined indices, compact mask, the fused launch) against the CPU ops."""

import functools

import pytest
import torch

from conftest import needs_cuda
from ddtree_op import ops
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch
from test_prep import INDEX_CASES, check_prepare_verify_writes_the_plan
from test_prep import test_build_verify_indices_matches_loop as check_index_builder
from test_prep import test_prepare_verify_returns_both_steps as check_prepare_verify

pytestmark = needs_cuda


@pytest.mark.parametrize("prefix,drafts", INDEX_CASES)
def test_build_verify_indices_cuda(prefix, drafts):
    for dtypes in [(torch.int32, torch.int64), (torch.int64, torch.int32)]:
        check_index_builder(prefix, drafts, dtypes, device="cuda")


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("packed_dtype", [torch.uint8, torch.int16, torch.int64])
@pytest.mark.parametrize("use_mask_indptr", [True, False])
def test_convert_tree_mask_cuda_matches_cpu(layout, packed_dtype, use_mask_indptr):
    if layout == "full" and not use_mask_indptr:
        pytest.skip("the full layout needs mask_indptr")
    width = {torch.uint8: 8, torch.int16: 16, torch.int64: 64}[packed_dtype]
    gen = torch.Generator().manual_seed(width)
    drafts = [min(width, n) for n in (5, 0, 70, 1, 64)] if layout == "packed" else [5, 0, 70, 1, 64]
    prefix = [3, 9, 0, 100, 1]
    visibility = [torch.rand(n, n, generator=gen) < 0.5 for n in drafts]  # bits above the diagonal too
    mask, mask_indptr = encode_tree_mask(visibility, prefix, layout, packed_dtype, torch.bool)
    qo = torch.tensor([0] + drafts).cumsum(0)
    kv = torch.tensor([0] + prefix).cumsum(0).int()
    mask_indptr = mask_indptr if use_mask_indptr else None
    rows = sum(drafts) + 5
    for words in (1, 2):
        want = ops.convert_tree_mask(mask, mask_indptr, qo, kv, layout, rows, words)
        got = ops.convert_tree_mask(mask.cuda(), None if mask_indptr is None else mask_indptr.cuda(), qo.cuda(), kv.cuda(), layout, rows, words)
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_prepare_verify_cuda_matches_cpu(layout):
    """The fused preparation launch (index blocks, then mask blocks) against the CPU steps."""
    check_prepare_verify(layout, device="cuda")
    for prefix, drafts in INDEX_CASES:  # ragged, empty requests, no prefix
        if layout == "packed" and max(drafts, default=0) > 64:
            continue
        vb = make_verify_batch(list(prefix), list(drafts), 1, layout=layout, pad_rows=3, device="cuda", seed=len(prefix))
        rows = vb.q.shape[0]
        for words in (1, 2):
            got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                     vb.mask_indptr, layout, rows, words)
            cpu = [t.cpu() for t in (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask)]
            mask_indptr = None if vb.mask_indptr is None else vb.mask_indptr.cpu()
            want = ops.prepare_verify(*cpu, mask_indptr, layout, rows, words)
            for g, w in zip(got, want):
                assert torch.equal(g.cpu(), w)


def test_prepare_verify_cuda_writes_the_plan():
    check_prepare_verify_writes_the_plan(device="cuda")


@pytest.mark.parametrize("seed", range(60))
def test_verify_plan_cuda_matches_cpu(seed):
    """The plan-only launch against the CPU twin: ragged, empty and zero-draft requests, B up to
    4096 (many chunks of the scan; around LONGEST_FIRST_MAX_BATCH, where the pieces' order
    changes; below it, batches that give each request's rank groups of 1 to 32 threads), padding
    rows, several schedules."""
    import random

    from ddtree_op.prep import verify_plan

    rng = random.Random(seed)
    batch = rng.choice([0, 1, 2, 3, 7, 12, 33, 64, 100, 129, 255, 256, 257, 511, 512, 513, 1000, 1023, 4096])
    drafts = [rng.choice([0, 1, 4, 16, 64]) for _ in range(batch)]
    keys = [n + rng.choice([0, 5, 128, 1000, 70000]) for n in drafts]
    qo = torch.tensor([0] + drafts).cumsum(0)
    vi = torch.tensor([0] + keys).cumsum(0).int()
    heads, ctas, splits = rng.choice([1, 16, 128]), rng.choice([1, 5, 132]), rng.choice([1, 2, 40])
    rows = int(qo[-1]) + rng.choice([0, 3, 100])
    for qo_dtype in (torch.int32, torch.int64):
        got = torch.ops.ddtree_cuda.verify_plan(qo.to(qo_dtype).cuda(), vi.cuda(), rows, heads, ctas, splits)
        assert torch.equal(got.cpu(), verify_plan(qo, vi, rows, heads, ctas, splits)), (batch, heads, ctas, splits)


@pytest.mark.parametrize("seed", range(24))
def test_verify_plan_cuda_matches_cpu_lane_by_lane(seed):
    """Equal drafts and unequal prefixes (a serving step), whose equal shares go lane by lane
    where the row blocks divide the CTAs well (persistent_schedule.share_lanes); B up to 256 and
    one past it."""
    import random

    from ddtree_op.prep import verify_plan

    rng = random.Random(seed)
    batch, n = rng.choice([2, 8, 32, 255, 256, 257]), rng.choice([1, 4, 16, 64])
    keys = [n + rng.randint(0, 12288) for _ in range(batch)]
    qo = torch.arange(batch + 1) * n
    vi = torch.tensor([0] + keys).cumsum(0).int()
    heads, ctas = rng.choice([16, 128]), rng.choice([7, 16, 132])
    rows = int(qo[-1]) + rng.choice([0, 3])
    got = torch.ops.ddtree_cuda.verify_plan(qo.int().cuda(), vi.cuda(), rows, heads, ctas, 1)
    assert torch.equal(got.cpu(), verify_plan(qo, vi, rows, heads, ctas, 1)), (batch, n, heads, ctas)


@pytest.mark.parametrize("batch", [1000, 2048])
def test_prepare_verify_cuda_plan_of_many_requests(batch):
    """Many requests (the plan's scan in several chunks) through the preparation: staged, and above
    kSharedBatch after the one-block pass."""
    from ddtree_op import backends, contract
    from ddtree_op.prep import verify_plan

    drafts = [(b * 7) % 17 for b in range(batch)]
    prefix = [(b * 131) % 3000 for b in range(batch)]
    vb = make_verify_batch(prefix, drafts, 16, layout="qlen", pad_rows=4, device="cuda", seed=9)
    rows = vb.q.shape[0]
    plan = torch.empty(contract.plan_numel(rows, 16, batch), dtype=torch.long, device="cuda")
    got = ops.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "qlen",
                             rows, 1, vb.kv_cache.shape[0], 0, None, plan, 16)
    ctas, splits = backends.plan_schedule(plan.device, rows, 16, batch, vb.kv_indices.numel() + vb.out_cache_loc.numel())
    assert torch.equal(plan.cpu(), verify_plan(got[3].cpu(), got[0].cpu(), rows, 16, ctas, splits))


# Around and past the staged batch (1023 requests in shared memory; above, a one-block pass first).
LARGE_BATCHES = [1023, 1024, 1025, 4096, 65536]


@functools.lru_cache(maxsize=1)  # a 65536-request batch takes seconds to build: once for both variants
def _large_batch(batch, layout, device, seed=0):
    prefix = [(7 * b) % 12 for b in range(batch)]
    drafts = [1 + b % 3 for b in range(batch)]
    return make_verify_batch(prefix, drafts, 1, layout=layout, pad_rows=5, device=device, seed=seed,
                             packed_dtype=torch.uint8)


def _bad_entries(kw, batch):
    """Faults past the staged range (where the batch has one): a decreasing kv_indptr entry, a
    draft slot out of range, a qo_indptr entry beyond T_pad."""
    kw = dict(kw)
    for name in ("kv_indptr", "out_cache_loc", "qo_indptr"):
        kw[name] = kw[name].clone()
    kw["kv_indptr"][batch - 3] = 0
    kw["out_cache_loc"][5] = -2
    kw["qo_indptr"][batch - 1] = 10**9
    return kw


@pytest.mark.parametrize("bad", [False, True])  # the first decorator varies fastest: one batch for both
@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("batch", LARGE_BATCHES)
def test_prep_ops_large_batches_match_cpu(batch, layout, bad):
    """Bit for bit against the CPU programs, status included: the fused launch, and the two
    single-step ops (combined indices, mask conversion); qlen also without mask_indptr."""
    import ddtree_op

    cpu = _large_batch(batch, layout, "cpu")
    base = {k: v for k, v in cpu.kwargs().items() if isinstance(v, torch.Tensor) or v is None}
    variants = [base] + ([dict(base, mask_indptr=None)] if layout == "qlen" else [])
    rows, slots = cpu.q.shape[0], cpu.kv_cache.shape[0]
    for kw in variants:
        kw = _bad_entries(kw, batch) if bad else kw
        args = [kw[n] for n in ("qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "tree_mask", "mask_indptr")]
        gpu_args = [None if t is None else t.cuda() for t in args]
        want_status, got_status = ddtree_op.new_status(), ddtree_op.new_status("cuda")
        want = ops.prepare_verify(*args, layout, rows, 1, slots, 0, want_status)
        got = ops.prepare_verify(*gpu_args, layout, rows, 1, slots, 0, got_status)
        total = int(want[0][-1])
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[3].cpu(), want[3])
        assert torch.equal(got[1][:total].cpu(), want[1][:total]) and torch.equal(got[2].cpu(), want[2])
        assert torch.equal(got_status.cpu(), want_status), (got_status.tolist(), want_status.tolist())
        assert bool(want_status[0]) == bad
        indptr, indices = ops.build_verify_indices(*args[:4])
        got_indptr, got_indices = ops.build_verify_indices(*gpu_args[:4])
        end = int(indptr[-1])
        assert torch.equal(got_indptr.cpu(), indptr) and torch.equal(got_indices[:end].cpu(), indices[:end])
        words = ops.convert_tree_mask(args[4], args[5], args[0], args[1], layout, rows, 1)
        assert torch.equal(ops.convert_tree_mask(gpu_args[4], gpu_args[5], gpu_args[0], gpu_args[1], layout, rows, 1).cpu(),
                           words)


@pytest.mark.parametrize("batch", [1023, 1024, 1025, 4096])
def test_verify_step_large_batches_match_reference(batch):
    """`mla_tree_verify` on CUDA against the CPU reference, with a status: clean on the valid batch;
    with faults past the staged range, the same status as the CPU and the same sanitized output."""
    import ddtree_op
    from gpu_cases import assert_matches_reference, cuda_backends

    cpu = _large_batch(batch, "full", "cpu", seed=1)
    q, kv_cache = cpu.q.cuda(), cpu.kv_cache.cuda()
    for bad in (False, True):
        cpu_kw = _bad_entries(cpu.kwargs(), batch) if bad else cpu.kwargs()
        want_status = ddtree_op.new_status()
        ref_out, ref_lse = ddtree_op.mla_tree_verify(cpu.q, cpu.kv_cache, **cpu_kw, status=want_status)
        for backend in cuda_backends():
            kw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cpu_kw.items()}
            status = ddtree_op.new_status("cuda")
            out, lse = ddtree_op.mla_tree_verify(q, kv_cache, **kw, backend=backend, status=status)
            where = f"backend {backend}, {'bad' if bad else 'clean'} batch"
            try:
                assert_matches_reference(out.cpu(), lse.cpu(), ref_out, ref_lse)
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from exc
            assert torch.equal(status.cpu(), want_status), (where, status.tolist(), want_status.tolist())
            assert bool(want_status[0]) == bad


def test_large_batch_status_in_replayed_cuda_graph():
    """Above the staged batch the step is two launches (the one-block pass, then the preparation):
    captured, a replay with a bad value sets the status, the next one with good values clears it,
    and the output is the CPU reference's again."""
    import ddtree_op
    from gpu_cases import assert_matches_reference

    batch = 2048
    cpu = _large_batch(batch, "full", "cpu", seed=2)
    ref_out, ref_lse = ddtree_op.mla_tree_verify(cpu.q, cpu.kv_cache, **cpu.kwargs())
    q, kv_cache = cpu.q.cuda(), cpu.kv_cache.cuda()
    buffers = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cpu.kwargs().items()}
    good = {k: v.clone() for k, v in buffers.items() if isinstance(v, torch.Tensor)}
    status = ddtree_op.new_status("cuda")
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(q.shape[0], q.shape[1], device="cuda")

    def step():
        ddtree_op.mla_tree_verify(q, kv_cache, **buffers, out=out, lse=lse, status=status)

    from gpu_cases import capture

    graph, _ = capture(step)
    for name, index, value, kind in [("kv_indptr", batch - 5, 0, "kv_order"), ("out_cache_loc", 3000, -1, "draft_slot"),
                                     ("qo_indptr", batch, 10**6, "qo_rows")]:
        graph.replay()
        torch.cuda.synchronize()
        assert ddtree_op.decode_status(status) == []
        assert_matches_reference(out.cpu(), lse.cpu(), ref_out, ref_lse)
        buffers[name][index] = value
        graph.replay()
        torch.cuda.synchronize()
        assert ddtree_op.decode_status(status)[0][0] == kind, ddtree_op.decode_status(status)
        buffers[name].copy_(good[name])
    graph.replay()
    torch.cuda.synchronize()
    assert ddtree_op.decode_status(status) == []
    assert_matches_reference(out.cpu(), lse.cpu(), ref_out, ref_lse)
