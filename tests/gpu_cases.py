"""Shared GPU correctness parametrisation for every CUDA backend (a sampled grid of shapes), and
the helpers of the tests/test_gpu_*.py files."""

import pytest
import torch

from conftest import relative_error
from ddtree_op import mla_tree_verify, ops
from ddtree_op.synthetic import encode_tree_mask, make_verify_batch

# (prefix lengths, draft lengths, heads); covers H in {1,16,32,128}, n in {1,2,4,8,16,33,64,128},
# P in {0,1,63,64,65,1000,8192,65536}, B in {1,3,32}, uniform and ragged.
ATTENTION_CASES = [
    ([0], [1], 1),
    ([1, 63, 64], [2, 33, 1], 1),
    ([65536], [4], 16),
    ([1000] * 32, [16] * 32, 16),
    ([65, 8192, 0], [8, 64, 128], 16),
    ([1000, 0, 63], [33, 1, 16], 32),
    ([8192], [64], 128),
    ([1, 65536, 64], [128, 2, 4], 128),
    ([(37 * b) % 2000 for b in range(32)], [1 + b % 16 for b in range(32)], 128),
    ([3000, 1000, 9000], [16, 16, 16], 16),  # ragged prefixes, split-KV path
]


EDGE_CASES = [
    ([5], [1], 16),  # q_len 1
    ([0, 0], [3, 4], 16),  # no prefix at all
    ([40, 7, 9], [0, 5, 0], 16),  # requests with no drafts
    ([131072], [8], 16),  # B = 1, P = 128k
    ([2000], [64], 128),  # H = 128, n = 64
]

# Equal drafts and unequal prefixes (a serving step), which the persistent kernel's equal shares
# take lane by lane (persistent_schedule.share_lanes): at 5 CTAs one lane each, at 132 with cuts.
LANE_CASES = [
    ([3000, 700, 9000], [20, 20, 20], 16),
    ([3000, 700, 9000, 64], [8, 8, 8, 8], 128),
]

# (CTAs, splits) for the persistent kernel's tests; splits None: the shape-only count.
PERSISTENT_SCHEDULES = [(1, 1), (5, 1), (5, 2), (132, None)]


def case_id(case):
    prefix, drafts, heads = case
    return f"H{heads}-B{len(prefix)}-n{max(drafts)}-P{max(prefix)}"


def blank_rows(vb, rows_per_request=1):
    """Makes the last draft row of each request see no draft at all (DDTree padding nodes)."""
    vis = [v.clone() for v in vb.visibility]
    for v in vis:
        if v.shape[0] > 1:
            v[-rows_per_request:] = False
    vb.tree_mask, vb.mask_indptr = encode_tree_mask(vis, vb.prefix_lens, vb.mask_layout)
    vb.tree_mask = vb.tree_mask.to(vb.q.device)
    vb.mask_indptr = None if vb.mask_indptr is None else vb.mask_indptr.to(vb.q.device)
    vb.visibility = vis
    return vb


def strided_copy(q):
    """The same values as q in a view with token and head strides that are not contiguous."""
    big = torch.randn(q.shape[0], q.shape[1] + 2, q.shape[2] + 32, device=q.device).to(q.dtype)
    view = big[:, 1 : q.shape[1] + 1, 16 : 16 + q.shape[2]]
    view.copy_(q)
    return view


def wide_row_copy(kv_cache):
    """The same KV rows as [S, 1, 576] views of a pool whose rows are 640 elements apart (row
    stride > 576, as when the latent buffer carries extra columns)."""
    wide = torch.randn(kv_cache.shape[0], 1, 640, device=kv_cache.device).to(kv_cache.dtype)
    view = wide[:, :, :576]
    view.copy_(kv_cache.reshape(kv_cache.shape[0], 1, 576))
    return view


def make_gpu_case(case, layout, dtype, seed):
    prefix, drafts, heads = case
    vb = make_verify_batch(prefix, drafts, heads, layout=layout, dtype=dtype, device="cuda", pad_rows=3, seed=seed)
    if seed % 2:
        vb = blank_rows(vb)
    if seed % 3 == 0:
        vb.q = strided_copy(vb.q)
    if seed % 4 == 1:
        vb.kv_cache = wide_row_copy(vb.kv_cache)
    return vb


# Batches that take each path of a CUDA backend: one split (no combine), several splits and the
# combine, unequal requests (the persistent schedule on sm90), padding rows and a request
# without drafts.
SCHEDULE_CASES = [
    ([700], [4], 16),
    ([8192, 3000], [16, 16], 16),
    ([12000, 100, 100, 100, 100, 100, 100, 100], [4] * 8, 128),
    ([40, 7, 9], [0, 5, 3], 16),
]


def env_modes(monkeypatch, name, modes):
    """Each mode of `modes` (mode -> value of environment variable `name`, None: unset) in turn, set."""
    for mode, value in modes.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        yield mode


def poisoned_outputs(vb):
    """out and lse for vb's q, filled with NaN: an element the kernel leaves unwritten fails."""
    rows, heads = vb.q.shape[0], vb.q.shape[1]
    return (torch.full((rows, heads, 512), float("nan"), device="cuda", dtype=vb.q.dtype),
            torch.full((rows, heads), float("nan"), device="cuda"))


def run_and_reference(vb, backend):
    out, lse = poisoned_outputs(vb)
    mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=out, lse=lse, backend=backend)
    ref_out, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend="reference")
    return out, lse, ref_out, ref_lse


def cuda_backends():
    """Every CUDA kernel this machine runs: the Triton fallback, and the sm_90a kernel on sm_90."""
    from ddtree_op.backends import sm90_kernel_available

    enabled = torch.cuda.is_available() and sm90_kernel_available(torch.device("cuda"))
    return ["triton"] + (["sm90"] if enabled else [])


def assert_matches_reference(out, lse, ref_out, ref_lse, tol=2e-2):
    assert not torch.isnan(out).any(), "NaN (or an unwritten poisoned element) in out"
    assert not torch.isnan(lse).any(), "NaN (or an unwritten poisoned element) in lse"
    error = relative_error(out, ref_out)
    assert error < tol, f"relative error {error:.2e}, bound {tol:.0e}"
    inf_mismatch = torch.isinf(lse) != torch.isinf(ref_lse)
    first = inf_mismatch.flatten().nonzero().flatten()[:8].tolist()
    assert not first, f"lse is -inf where the reference's is not, or the other way, at flat indices {first}"
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    assert torch.all(out[torch.isinf(ref_lse)] == 0)


needs_sm90 = pytest.mark.skipif("sm90" not in cuda_backends(), reason="the sm_90a kernel needs an sm_90 GPU")


def run_sm90(vb, **schedule):
    """The sm_90a kernel called directly (to force a schedule), with poisoned outputs. It reads the
    preparation's plan where the schedule is the one that plan was made for, else makes its own."""
    from ddtree_op.api import mask_words_per_row, new_plan
    from ddtree_op.backends.sm90.attention import tree_attention_sm90
    from ddtree_op.checks import kv_rows

    rows, heads = vb.q.shape[0], vb.q.shape[1]
    words = mask_words_per_row(vb.tree_mask, vb.mask_layout, rows, None)
    plan = new_plan(vb.q, vb.qo_indptr)
    verify_indptr, verify_indices, mask_words, qo_indptr = ops.prepare_verify(
        vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, vb.mask_layout, rows, words,
        vb.kv_cache.shape[0], 0, None, plan, heads,
    )
    out, lse = poisoned_outputs(vb)
    tree_attention_sm90(vb.q, kv_rows(vb.kv_cache), qo_indptr, verify_indptr, verify_indices, mask_words, vb.sm_scale,
                        out, lse, plan=plan, **schedule)
    return out, lse


def capture(fn):
    """A CUDA graph of fn(), after one warm-up call on a side stream (loads libraries, compiles
    kernels, as a serving engine's warm-up does): (graph, what the captured call returned)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result
