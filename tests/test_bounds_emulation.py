"""The CUDA preparation headers' logic on the CPU: cutlass_kernels/verify_status.cuh,
verify_indices.cuh and tree_mask.cuh compiled for the host, with threads, barriers and warp votes
emulated (tests/cuda_emulation/), against the CPU program, bit for bit, outputs and status.

It checks the kernel's logic (sanitizing, block reductions, the last-block status), not the GPU's
memory model. Building it takes minutes, so it runs only with DDTREE_TEST_EMULATION=1.
"""

import os
from pathlib import Path

import pytest
import torch

import ddtree_op
from ddtree_op import prep
from ddtree_op.api import mask_words_per_row
from ddtree_op.synthetic import make_verify_batch
from test_bounds_safety import CASES, _batch

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(os.environ.get("DDTREE_TEST_EMULATION", "0") != "1",
                                reason="set DDTREE_TEST_EMULATION=1 to build the host emulation of the CUDA preparation (minutes)")


@pytest.fixture(scope="module")
def emu():
    from torch.utils.cpp_extension import load

    build = Path(os.environ.get("DDTREE_CACHE_DIR", Path.home() / ".cache" / "ddtree_op")) / "emulation"
    build.mkdir(parents=True, exist_ok=True)
    return load(name="ddtree_prepare_emu", sources=[str(HERE / "cuda_emulation" / "prepare_verify_emu.cpp")],
                extra_cflags=["-std=c++20", "-O1", f"-I{HERE / 'cuda_emulation'}", f"-I{HERE.parent / 'cutlass_kernels'}"],
                build_directory=str(build))


def _compare(emu, kw, layout, rows, num_slots, max_draft_len, words=None):
    words = words or mask_words_per_row(kw["tree_mask"], layout, rows, max_draft_len)
    results = []
    for fn in (emu.prepare_verify_emu, prep.prepare_verify_checked):
        status = ddtree_op.new_status()
        got = fn(kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"], kw["mask_indptr"],
                 layout, rows, words, num_slots, max_draft_len or 0, status)
        results.append(list(got) + [status])
    (vi, vx, mw, qo, st), (wvi, wvx, wmw, wqo, wst) = results
    total = int(wvi[-1])
    assert torch.equal(vi, wvi) and torch.equal(qo, wqo) and torch.equal(mw, wmw)
    assert torch.equal(vx[:total], wvx[:total])
    assert torch.equal(st, wst), (st.tolist(), wst.tolist())  # the workspace too: left zeroed


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_cuda_preparation_matches_cpu_on_bad_values(emu, case):
    vb = _batch(case, "cpu")
    kw = vb.kwargs()
    case.mutate(vb, kw)
    _compare(emu, kw, case.layout, vb.q.shape[0], vb.kv_cache.shape[0], case.max_draft_len)


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_emulated_cuda_preparation_matches_cpu_on_valid_batches(emu, layout):
    for prefix, drafts in [([5, 0, 70], [3, 4, 0]), ([0, 0], [1, 1]), ([300, 17, 2, 0, 9], [5, 2, 7, 1, 3]), ([], [])]:
        vb = make_verify_batch(prefix, drafts, 1, layout=layout, pad_rows=3, seed=3)
        for words in (1, 2):
            _compare(emu, vb.kwargs(), layout, vb.q.shape[0], vb.kv_cache.shape[0], None, words)


def test_emulated_cuda_preparation_past_the_staged_batch(emu):
    """B = 1100 > the 1023 requests staged in shared memory: the global-memory path."""
    n = 1100
    vb = make_verify_batch([1 + i % 5 for i in range(n)], [1 + i % 3 for i in range(n)], 1, pad_rows=2, seed=4)
    _compare(emu, vb.kwargs(), "full", vb.q.shape[0], vb.kv_cache.shape[0], None)
    kw = vb.kwargs()
    kw["kv_indptr"] = kw["kv_indptr"].clone()
    kw["kv_indptr"][1050] = 0
    _compare(emu, kw, "full", vb.q.shape[0], vb.kv_cache.shape[0], None)
