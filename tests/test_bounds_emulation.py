"""The CUDA preparation headers' logic on the CPU: cutlass_kernels/verify_status.cuh,
verify_indices.cuh and tree_mask.cuh compiled for the host, with threads, barriers and warp votes
emulated (tests/cuda_emulation/), against the CPU program, bit for bit, outputs and status.

It checks the kernel's logic (sanitizing, block reductions, the last-block status), not the GPU's
memory model. Building it takes minutes, so it runs only with DDTREE_TEST_EMULATION=1.
"""

import hashlib
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

    # The extension's own rebuild check does not look at headers: name the build by all of them.
    files = sorted(f for f in (HERE / "cuda_emulation").iterdir() if f.is_file())
    files += sorted((HERE.parent / "cutlass_kernels").glob("*.cuh"))
    key = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    build = Path(os.environ.get("DDTREE_CACHE_DIR", Path.home() / ".cache" / "ddtree_op")) / "emulation" / key
    build.mkdir(parents=True, exist_ok=True)
    return load(name=f"ddtree_prepare_emu_{key}", sources=[str(HERE / "cuda_emulation" / "prepare_verify_emu.cpp")],
                extra_cflags=["-std=c++20", "-O1", f"-I{HERE / 'cuda_emulation'}", f"-I{HERE.parent / 'cutlass_kernels'}"],
                build_directory=str(build))


def _compare(emu, kw, layout, rows, num_slots, max_draft_len, words=None, paths=(False, True), status_offset=0):
    """The emulated launch on the staged path (for B <= 1023; above, both take the unstaged one)
    and on the unstaged path, each against the CPU program; `status_offset` puts the status at an
    odd word of a larger buffer, so the 64-bit ticket takes the next word."""
    words = words or mask_words_per_row(kw["tree_mask"], layout, rows, max_draft_len)
    args = (kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"], kw["mask_indptr"],
            layout, rows, words, num_slots, max_draft_len or 0)
    want_status = ddtree_op.new_status()
    wvi, wvx, wmw, wqo = prep.prepare_verify_checked(*args, want_status)
    total = int(wvi[-1])
    for unstaged in paths:
        buffer = torch.zeros(ddtree_op.status.STATUS_SIZE + 1, dtype=torch.int32)
        status = buffer[status_offset:status_offset + ddtree_op.status.STATUS_SIZE]
        status[: ddtree_op.status.WORKSPACE] = 7  # stale values of an earlier step: rewritten
        vi, vx, mw, qo = emu.prepare_verify_emu(*args, status, unstaged)
        assert torch.equal(vi, wvi) and torch.equal(qo, wqo) and torch.equal(mw, wmw), unstaged
        assert torch.equal(vx[:total], wvx[:total]), unstaged
        assert torch.equal(status, want_status), (unstaged, status.tolist(), want_status.tolist())  # workspace left zeroed


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


def test_emulated_status_ticket_at_an_unaligned_word(emu):
    case = next(c for c in CASES if c.name == "kv_indptr_decreasing")
    vb = _batch(case, "cpu")
    kw = vb.kwargs()
    case.mutate(vb, kw)
    _compare(emu, kw, case.layout, vb.q.shape[0], vb.kv_cache.shape[0], case.max_draft_len, status_offset=1)


# Emulated threads are OS threads: a 4096-request launch takes minutes, so one layout per size.
@pytest.mark.parametrize("n,layout", [(1023, "full"), (1024, "full"), (1025, "packed"), (4096, "qlen")])
def test_emulated_cuda_preparation_around_and_past_the_staged_batch(emu, n, layout):
    """B around and past the 1023 requests staged in shared memory: the unstaged pass and the
    global-memory index math, valid and with bad entries past the staged range."""
    vb = make_verify_batch([1 + i % 5 for i in range(n)], [1 + i % 3 for i in range(n)], 1, layout=layout, pad_rows=2,
                           seed=4)
    rows, slots = vb.q.shape[0], vb.kv_cache.shape[0]
    paths = (False, True) if n <= 1023 else (True,)  # above 1023 both take the unstaged path
    _compare(emu, vb.kwargs(), layout, rows, slots, None, paths=paths)
    if layout == "qlen":  # block starts from the sanitized draft counts (the unstaged pass's scan)
        _compare(emu, dict(vb.kwargs(), mask_indptr=None), layout, rows, slots, None, paths=paths)
    kw = vb.kwargs()
    kw["kv_indptr"] = kw["kv_indptr"].clone()
    kw["kv_indptr"][n - 40] = 0
    kw["kv_indices"] = kw["kv_indices"].clone()
    kw["kv_indices"][-3] = slots
    kw["qo_indptr"] = kw["qo_indptr"].clone()
    kw["qo_indptr"][n - 7] += 2  # one request more, the next one fewer: qo_order there
    _compare(emu, kw, layout, rows, slots, 2, paths=paths, status_offset=1)
