"""FP8 e4m3 KV (`kv_cache` float8_e4m3fn or its uint8 bytes, per-tensor `kv_scale`) through
`mla_tree_verify`: the reference against an independent float64 brute force on the dequantized
cache, argument errors, opcheck, compile, the Triton kernel in the interpreter; on a GPU the
Triton and sm90 kernels (both schedules) against the reference, `auto` routing and graph replay
with a new scale."""

import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import brute_force_verify, needs_cuda, relative_error, run_interpreter_script
from gpu_cases import assert_matches_reference, blank_rows, capture, cuda_backends, needs_sm90, run_sm90
from ddtree_op import mla_tree_verify, ops
from ddtree_op.api import mask_words_per_row
from ddtree_op.synthetic import make_verify_batch
from ddtree_op.synthetic_paged import dequantized_pool, fp8_cache

CASES = [([5, 0, 70], [3, 4, 0]), ([0], [6]), ([130, 17, 1], [16, 2, 9]), ([64], [1])]


def fp8_batch(prefix, drafts, heads, *, storage="fp8", scale=0.05, scale_tensor=False, device="cpu", **kwargs):
    """A verify batch whose cache is FP8 (stored = value / scale), and its kv_scale argument."""
    vb = make_verify_batch(prefix, drafts, heads, device=device, **kwargs)
    vb.kv_cache = fp8_cache(vb.kv_cache.float(), scale, storage)
    kv_scale = torch.tensor([scale], device=device) if scale_tensor else scale
    return vb, kv_scale


def brute_force(vb, kv_scale):
    """conftest's float64 brute force on the dequantized cache (only the test dequantizes it all)."""
    pool = dequantized_pool(vb.kv_cache.cpu(), kv_scale)
    return brute_force_verify(dataclasses.replace(vb, kv_cache=pool))


def assert_close(out, lse, want_out, want_lse, tol=1e-2):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert relative_error(out.cpu(), want_out) < tol
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], want_lse[finite], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("scale_tensor", [False, True])
@pytest.mark.parametrize("storage", ["fp8", "uint8"])
@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_reference_matches_brute_force(case, layout, storage, scale_tensor):
    vb, kv_scale = fp8_batch(*case, 2, storage=storage, scale_tensor=scale_tensor, layout=layout, pad_rows=2,
                             seed=len(case[0]), kv_cache_3d=storage == "uint8")
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    assert_close(out, lse, *brute_force(vb, kv_scale))


def test_no_scale_means_one():
    vb, _ = fp8_batch([20], [4], 2, scale=1.0)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    assert_close(out, lse, *brute_force(vb, None))


def test_fp16_queries():
    vb, kv_scale = fp8_batch([40, 2], [5, 3], 3, dtype=torch.float16, scale_tensor=True)
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    assert out.dtype == torch.float16
    assert_close(out, lse, *brute_force(vb, kv_scale))


@pytest.mark.parametrize("change,message", [
    (dict(kv_scale=torch.tensor([0.5, 0.5])), "kv_scale"),
    (dict(kv_scale=torch.tensor([0.5], dtype=torch.float64)), "kv_scale"),
    (dict(kv_scale=float("nan")), "kv_scale"),
    (dict(kv_scale="0.5"), "kv_scale"),
])
def test_bad_kv_scale_names_the_argument(change, message):
    vb, _ = fp8_batch([20], [4], 2)
    with pytest.raises(ValueError, match=message):
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), **change)


def test_kv_scale_on_a_bf16_cache_is_an_error():
    vb = make_verify_batch([20], [4], 2)
    with pytest.raises(ValueError, match="kv_scale"):
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=0.5)


def test_other_kv_dtypes_are_errors():
    vb = make_verify_batch([20], [4], 2)
    with pytest.raises(ValueError, match="kv_cache"):
        mla_tree_verify(vb.q, vb.kv_cache.float(), **vb.kwargs())


def test_opcheck_attention_with_fp8_and_scale():
    # The uint8 bytes of the cache: opcheck's schema check compares inputs with allclose, which
    # torch's CPU backend lacks for float8 (the op reads both storages the same way).
    for i, (prefix, drafts) in enumerate(CASES[:3]):
        vb, kv_scale = fp8_batch(prefix, drafts, 2, storage="uint8", scale_tensor=True, pad_rows=1, seed=i)
        rows = vb.q.shape[0]
        words = mask_words_per_row(vb.tree_mask, vb.mask_layout, rows, None)
        verify_indptr, verify_indices, mask_words, qo = ops.prepare_verify(
            vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, vb.mask_layout, rows,
            words, vb.kv_cache.shape[0])
        args = (vb.q, vb.kv_cache, qo, verify_indptr, verify_indices, mask_words, vb.sm_scale)
        torch.library.opcheck(ops.tree_attention, args, dict(kv_scale=kv_scale))
        torch.library.opcheck(ops.tree_attention, args, dict(kv_scale_value=0.05))
        out = torch.randn(rows, 2, 512).to(vb.q.dtype)
        lse = torch.randn(rows, 2)
        torch.library.opcheck(ops.tree_attention_into, args + (out, lse), dict(kv_scale=kv_scale))


def fp8_step(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, kv_scale):
    out, lse = mla_tree_verify(q, kv_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               out_cache_loc=out_cache_loc, tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=0.1352,
                               kv_scale=kv_scale)
    return out * 2, lse + 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_fullgraph_one_frame_no_recompile(device):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fp8_step, backend=counter, fullgraph=True)
    for i, (prefix, drafts) in enumerate([([20, 7], [4, 6]), ([33, 2], [9, 8]), ([5, 11, 40], [8, 8, 8])]):
        vb, kv_scale = fp8_batch(prefix, drafts, 2, scale=0.03 + 0.01 * i, scale_tensor=True, device=device, pad_rows=2, seed=i)
        args = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr)
        for t in args:
            torch._dynamo.mark_dynamic(t, 0)
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            out, lse = compiled(*args, kv_scale)
        want_out, want_lse = fp8_step(*args, kv_scale)
        assert relative_error(out, want_out) < 1e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert counter.frame_count == 1


def test_explain_reports_no_graph_break():
    vb, kv_scale = fp8_batch([10, 3], [5, 2], 2, scale_tensor=True, pad_rows=1)
    args = (vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, kv_scale)
    explanation = torch._dynamo.explain(fp8_step)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_triton_fp8_and_paged_in_the_interpreter():
    run_interpreter_script("interpret_fp8_paged.py")


def every_finite_e4m3_row(device):
    """576 e4m3 bytes holding each finite value (all but the NaN bytes 0x7f and 0xff) at least twice,
    subnormals, both zeros and +-448 included."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    return finite.repeat(3)[: 576].to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=needs_cuda),
                                     pytest.param("sm90", marks=[needs_cuda, needs_sm90])])
def test_every_e4m3_value_reads_exactly(backend, dtype):
    """One draft without a prefix sees only its own key, so its output is that key's V row times
    kv_scale (softmax weight 1): every finite e4m3 value must come through the widening exactly
    (up to the rounding of a weight of 1 in a kernel's exponential)."""
    device = "cpu" if backend == "reference" else "cuda"
    vb, kv_scale = fp8_batch([0], [1], 16, dtype=dtype, scale=0.25, device=device, seed=3, storage="uint8")
    slot = int(vb.out_cache_loc[0])
    vb.kv_cache[slot] = every_finite_e4m3_row(device)
    out, _ = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend=backend)
    values = vb.kv_cache[slot, :512].view(torch.float8_e4m3fn).float() * kv_scale
    want = values.to(dtype).expand(16, 512)
    subnormal = (values != 0) & (values.abs() < 2.0**-6 * kv_scale)
    assert (values != 0).sum() > 400 and subnormal.sum() >= 14  # every subnormal, both signs
    torch.testing.assert_close(out[0], want, rtol=2.0**-7, atol=0)


# ---------------------------------------------------------------- GPU (the lead runs these)


GPU_GRID = [([0], [1], 16), ([127], [1], 128), ([4000, 100, 0, 64], [4, 1, 3, 2], 16), ([8192], [256], 16),
            ([131072], [16], 16), ([131072, 2048], [4, 64], 128), ([65536] * 4, [8] * 4, 16), ([1024] * 32, [16] * 32, 16)]


@needs_cuda
@pytest.mark.parametrize("scale_tensor", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPU_GRID, ids=lambda c: f"P{c[0][:2]}-n{c[1][:2]}-H{c[2]}")
@pytest.mark.parametrize("backend", ["triton", "sm90", "auto"])
def test_kernels_match_reference(backend, case, dtype, scale_tensor):
    if backend not in cuda_backends() + ["auto"]:
        pytest.skip("the sm_90a kernel needs an sm_90 GPU")
    prefix, drafts, heads = case
    vb, kv_scale = fp8_batch(prefix, drafts, heads, dtype=dtype, scale_tensor=scale_tensor, device="cuda", pad_rows=3,
                             layout="full", seed=1, storage="uint8" if scale_tensor else "fp8")
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    out, lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend=backend)
    assert_matches_reference(out, lse, ref_out, ref_lse)


SCHEDULES = [dict(schedule="split", num_splits=1), dict(schedule="split", num_splits=3),
             dict(schedule="persistent", ctas=5, num_splits=2), dict(schedule="persistent", ctas=132, num_splits=1)]


@needs_cuda
@needs_sm90
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("case", GPU_GRID[2:], ids=lambda c: f"P{c[0][:2]}-n{c[1][:2]}-H{c[2]}")
def test_sm90_schedules_match_reference(case, schedule):
    """The sm_90a kernel's FP8 gather in both schedules, partials and merges included, whatever
    `auto` would pick; the scale as a device tensor and as a value."""
    prefix, drafts, heads = case
    for scale_tensor in (True, False):
        vb, kv_scale = fp8_batch(prefix, drafts, heads, scale=0.03, scale_tensor=scale_tensor, device="cuda", pad_rows=2,
                                 layout="full", seed=len(prefix) + heads)
        ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
        scale_args = dict(kv_scale=kv_scale) if scale_tensor else dict(kv_scale_value=kv_scale)
        assert_matches_reference(*run_sm90(vb, **schedule, **scale_args), ref_out, ref_lse)


# Row blocks of 8, 16, 32, 48 and 64 rows (the transposed kernel's N = 16, 32, 64), ragged
# requests, an empty prefix, a piece of one tile, requests cut into pieces.
TRANSPOSED_CASES = [([0], [1], 8), ([300, 0, 4097], [1, 1, 1], 16), ([1000, 64], [2, 2], 16), ([130, 5000], [3, 4], 16),
                    ([20000], [1], 128), ([64, 129, 7000], [2, 5, 1], 32)]


@needs_cuda
@needs_sm90
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=lambda c: f"P{c[0][:3]}-n{c[1][:3]}-H{c[2]}")
def test_transposed_kernel_matches_reference(case, dtype, num_splits):
    """The transposed e4m3 kernel (the split schedule's, chosen by fp8_kernel) at every N, alone
    and cut into pieces, against the reference and beside the widened kernel."""
    prefix, drafts, heads = case
    vb, kv_scale = fp8_batch(prefix, drafts, heads, dtype=dtype, scale=0.04, device="cuda", pad_rows=3, layout="full",
                             seed=sum(prefix) + heads)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    for kernel in ("transposed", "widened"):
        out, lse = run_sm90(vb, schedule="split", num_splits=num_splits, kv_scale_value=kv_scale, fp8_kernel=kernel)
        assert_matches_reference(out, lse, ref_out, ref_lse)


@needs_cuda
@needs_sm90
def test_transposed_kernel_rows_that_see_nothing_and_auto_takes_it():
    """Rows that see no key (an empty prefix, a blank tree row): out 0, lse -inf; and `auto` runs
    the transposed kernel (bit for bit) where the schedule is split."""
    vb, kv_scale = fp8_batch([0, 40, 3000], [3, 4, 2], 16, scale=0.04, device="cuda", pad_rows=2, seed=5)
    vb = blank_rows(vb)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    assert torch.isinf(ref_lse).any()
    out, lse = run_sm90(vb, schedule="split", num_splits=2, kv_scale_value=kv_scale, fp8_kernel="transposed")
    assert_matches_reference(out, lse, ref_out, ref_lse)
    auto_out, auto_lse = run_sm90(vb, schedule="split", num_splits=2, kv_scale_value=kv_scale)
    assert torch.equal(auto_out, out) and torch.equal(auto_lse, lse)


@needs_cuda
@needs_sm90
def test_transposed_kernel_scales_large_queries_into_fp16():
    """bf16 q beyond fp16's range (rows of 2^10 to 2^20 times the usual size, sm_scale 2^-15 times,
    so the logits are 2^-5 to 2^5 times ordinary ones): the transposed kernel stages q in fp16
    under one power of two a row block."""
    vb, kv_scale = fp8_batch([500, 3000], [3, 1], 16, scale=0.04, device="cuda", pad_rows=2, seed=11)
    row_sizes = 2.0 ** torch.linspace(10, 20, vb.q.shape[0] * 16, device="cuda").view(vb.q.shape[0], 16, 1)
    vb.q = (vb.q.float() * row_sizes).to(torch.bfloat16)
    vb.sm_scale = vb.sm_scale / 2**15
    assert vb.q.float().abs().max() > 65504
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
    out, lse = run_sm90(vb, schedule="split", num_splits=2, kv_scale_value=kv_scale, fp8_kernel="transposed")
    assert_matches_reference(out, lse, ref_out, ref_lse)


@needs_cuda
@needs_sm90
def test_transposed_kernel_is_split_only():
    vb, kv_scale = fp8_batch([100], [2], 16, device="cuda")
    with pytest.raises(RuntimeError, match="fp8_kernel 'transposed' takes"):
        run_sm90(vb, schedule="persistent", ctas=4, num_splits=1, kv_scale_value=kv_scale, fp8_kernel="transposed")
    with pytest.raises(ValueError, match="fp8_kernel"):
        run_sm90(vb, schedule="split", kv_scale_value=kv_scale, fp8_kernel="fast")


@needs_cuda
def test_auto_sends_fp8_to_the_fastest_kernel(fresh_dispatch):
    from ddtree_op.backends import choose, input_class

    vb, _ = fp8_batch([100], [4], 16, device="cuda")
    out = torch.empty(vb.q.shape[0], 16, 512, dtype=vb.q.dtype, device="cuda")
    assert choose(vb.q.device, "auto", input_class(vb.q, vb.kv_cache, out)).name == cuda_backends()[-1]


@needs_cuda
def test_graph_replay_reads_the_new_kv_scale():
    vb, kv_scale = fp8_batch([3000, 17], [16, 5], 16, scale_tensor=True, device="cuda", pad_rows=3, seed=7)
    out = torch.full((vb.q.shape[0], 16, 512), float("nan"), dtype=vb.q.dtype, device="cuda")
    lse = torch.full((vb.q.shape[0], 16), float("nan"), device="cuda")

    def step():
        mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, out=out, lse=lse)

    graph, _ = capture(step)
    for value in (0.02, 0.09):
        kv_scale.fill_(value)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=kv_scale, backend="reference")
        assert relative_error(out, ref_out) < 2e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
