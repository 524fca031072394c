"""The CUDA preparation headers' logic on the CPU: cutlass_kernels/verify_status.cuh, status.cuh,
verify_indices.cuh and tree_mask.cuh compiled for the host, with threads, barriers and warp votes
emulated (tests/cuda_emulation/), against the CPU program, bit for bit, outputs and status. The
status both ways: published by the preparation's last block (the op alone, the ticket), and left
in its keys for one thread of the next launch to publish (the verify step).

It checks the kernel's logic (sanitizing, block reductions, the last-block status), not the GPU's
memory model. Building it takes minutes, so it runs only with DDTREE_TEST_EMULATION=1.
"""

import hashlib
import itertools
import os
import re
from pathlib import Path

import pytest
import torch

import ddtree_op
from ddtree_op import prep
from ddtree_op.api import mask_words_per_row
from ddtree_op.synthetic import make_verify_batch
from test_bounds_safety import CASES, _batch

HERE = Path(__file__).resolve().parent
# The wide index build's positions a thread, as the kernels' header defines it.
WIDE_POSITIONS = int(re.search(r"kWidePositions = (\d+);", (HERE.parent / "cutlass_kernels" / "verify_indices.cuh").read_text())[1])
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
    and on the unstaged path, each with one and with WIDE_POSITIONS positions a thread of the
    index build, and each with both ways of publishing the status, against the CPU program;
    `status_offset` puts the status at an odd word of a larger buffer, so the 64-bit keys and
    ticket take the next word."""
    words = words or mask_words_per_row(kw["tree_mask"], layout, rows, max_draft_len)
    args = (kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"], kw["mask_indptr"],
            layout, rows, words, num_slots, max_draft_len or 0)
    want_status = ddtree_op.new_status()
    wvi, wvx, wmw, wqo = prep.prepare_verify_checked(*args, want_status)
    total = int(wvi[-1])
    for unstaged, positions_per_thread, last_block in itertools.product(paths, (1, WIDE_POSITIONS), (True, False)):
        buffer = torch.zeros(ddtree_op.status.STATUS_SIZE + 1, dtype=torch.int32)
        status = buffer[status_offset:status_offset + ddtree_op.status.STATUS_SIZE]
        status[: ddtree_op.status.WORKSPACE] = 7  # stale values of an earlier step: rewritten
        vi, vx, mw, qo = emu.prepare_verify_emu(*args, status, unstaged, positions_per_thread, last_block)
        path = (unstaged, positions_per_thread, last_block)
        assert torch.equal(vi, wvi) and torch.equal(qo, wqo) and torch.equal(mw, wmw), path
        assert torch.equal(vx[:total], wvx[:total]), path
        assert torch.equal(status, want_status), (path, status.tolist(), want_status.tolist())  # workspace left zeroed


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


@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_emulated_unstaged_pass_over_several_rounds(emu, layout):
    """The unstaged path (forced) against the staged one and the CPU on a batch of 300 requests:
    the emulated one-block pass has 64 threads, so its entry loop and its qlen scan take several
    rounds; valid, then bad entries in later rounds."""
    n = 300
    vb = make_verify_batch([1 + i % 5 for i in range(n)], [1 + i % 3 for i in range(n)], 1, layout=layout, pad_rows=2,
                           seed=4, packed_dtype=torch.uint8)
    rows, slots = vb.q.shape[0], vb.kv_cache.shape[0]
    _compare(emu, vb.kwargs(), layout, rows, slots, None)
    if layout == "qlen":  # block starts from the sanitized draft counts (the pass's scan)
        _compare(emu, dict(vb.kwargs(), mask_indptr=None), layout, rows, slots, None)
    kw = vb.kwargs()
    for name in ("kv_indptr", "kv_indices", "qo_indptr"):
        kw[name] = kw[name].clone()
    kw["kv_indptr"][n - 40] = 0
    kw["kv_indices"][200] = slots
    kw["qo_indptr"][n - 7] += 2  # one request more, the next one fewer: qo_order there
    _compare(emu, kw, layout, rows, slots, 2, status_offset=1)
    if layout == "qlen":
        _compare(emu, dict(kw, mask_indptr=None), layout, rows, slots, 2)


# Emulated threads are OS threads (a 1024-request launch takes minutes): small requests.
@pytest.mark.parametrize("n", [1023, 1024, 1025, 4096])
def test_emulated_cuda_preparation_around_the_staged_batch(emu, n):
    """The host's switch at 1023 requests: staged below, the one-block pass first above."""
    vb = make_verify_batch([i % 2 for i in range(n)], [1] * n, 1, layout="packed", pad_rows=2, seed=4,
                           packed_dtype=torch.uint8)
    kw = vb.kwargs()
    kw["kv_indptr"] = kw["kv_indptr"].clone()
    kw["kv_indptr"][n - 3] = 0
    _compare(emu, kw, "packed", vb.q.shape[0], vb.kv_cache.shape[0], None, paths=(False,))
