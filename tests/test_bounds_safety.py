"""A bad index value never kills the process: every case runs one verify step with one bad value
(DDTREE_CHECK unset) in its own process, then a valid call in the same process.

Each case checks: the process survives (no crash, no out-of-memory under a memory limit on CPU),
the status names the fault (its first kind, and raise_on_status raising exactly the error that
check_verify_inputs raises), rows of the requests the bad value does not touch are unchanged,
rows of a voided request get out 0 and lse -inf, nothing is NaN, and the valid call afterwards
matches the float64 brute force with a clean status.

Also runnable as a script, one case or all of them (for compute-sanitizer):
    python tests/test_bounds_safety.py --case NAME --device cuda --backend sm90
    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/test_bounds_safety.py --all --device cuda --backend triton
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

MEMORY_LIMIT_BYTES = 2 << 30  # CPU cases, beyond what is mapped at the start: an allocation sized from a bad value fails instead of being OOM-killed
BASE = dict(prefix=[6, 3, 9], drafts=[3, 2, 4], heads=2, pad_rows=2)  # rows: r0 0-2, r1 3-4, r2 5-8, padding 9-10


@dataclass
class Case:
    name: str
    mutate: Callable  # (vb, kwargs) -> None: changes kwargs (the call's keyword arguments) in place
    kind: str  # the status' first fault kind
    affected: set = field(default_factory=set)  # requests whose rows may change
    void: bool = False  # affected rows get out 0, lse -inf
    layout: str = "full"
    batch: dict = field(default_factory=dict)  # overrides of BASE / make_verify_batch arguments
    max_draft_len: int | None = None


def _set(name, index, value, dtype=None):
    def mutate(vb, kw):
        t = kw[name].clone() if dtype is None else kw[name].to(dtype).clone()
        t[index] = value
        kw[name] = t
    return mutate


def _replace(name, make):
    def mutate(vb, kw):
        kw[name] = make(vb, kw[name])
    return mutate


def _many(*mutations):
    def mutate(vb, kw):
        for m in mutations:
            m(vb, kw)
    return mutate


def _tensor(values, like):
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _packed_long_request(vb, kw):
    """Request 2 claims 75 drafts (more than a packed row's 64 bits): q, out_cache_loc and the
    packed mask are long enough, so only the width is wrong."""
    rows, used = vb.q.shape[0], vb.out_cache_loc.numel()
    gen = torch.Generator().manual_seed(5)
    more = torch.randint(0, vb.kv_cache.shape[0], (rows - used,), generator=gen).to(vb.out_cache_loc.device)
    kw["out_cache_loc"] = torch.cat([vb.out_cache_loc, more])
    kw["tree_mask"] = torch.cat([vb.tree_mask, torch.full((rows - used,), -1, dtype=vb.tree_mask.dtype, device=vb.q.device)])
    kw["qo_indptr"] = _tensor([0, 3, 5, 80], vb.qo_indptr)


S = sum(BASE["prefix"]) + sum(BASE["drafts"]) + 64  # rows of the KV pool make_verify_batch builds

CASES = [
    # The values of the table that made the process lose its CUDA context or return garbage.
    Case("prefix_slot_int32_max", _set("kv_indices", 1, 2**31 - 1), "kv_slot", {0}),
    Case("draft_slot_2p30", _set("out_cache_loc", 4, 2**30), "draft_slot", {1}),
    Case("kv_indptr_end_far_past_kv_indices", _set("kv_indptr", 3, 10**6), "kv_range", {2}, void=True),
    Case("prefix_slot_minus_1", _set("kv_indices", 7, -1), "kv_slot", {1}),
    Case("prefix_slot_S", _set("kv_indices", 10, S), "kv_slot", {2}),
    Case("kv_indptr_decreasing", _set("kv_indptr", 2, 4), "kv_order", {1, 2}, void=True),
    Case("mask_too_short", _replace("tree_mask", lambda vb, t: t[:40]), "mask_range", {2}),
    Case("mask_indptr_past_mask_end", _set("mask_indptr", slice(2, None), 10**6), "mask_range", {2}),
    Case("qo_indptr_not_starting_at_0", _replace("qo_indptr", lambda vb, t: t + 1), "qo_start", {0, 1, 2}, void=True),
    Case("qo_indptr_end_1e9", _set("qo_indptr", 3, 10**9, torch.int64), "qo_rows", {2}, void=True),
    # Our own.
    Case("qo_indptr_decreasing", _set("qo_indptr", 2, 2), "qo_order", {1, 2}, void=True),
    Case("qo_indptr_past_T_pad_by_one", _set("qo_indptr", 3, 12), "qo_rows", {2}, void=True),
    Case("qo_indptr_int64_2p40", _set("qo_indptr", 2, 2**40, torch.int64), "qo_order", {1, 2}, void=True),
    Case("out_cache_loc_shorter_than_drafts", _replace("out_cache_loc", lambda vb, t: t[:6]), "qo_slots", {2}, void=True),
    Case("draft_slot_negative_int64", _set("out_cache_loc", 0, -(2**40)), "draft_slot", {0}),
    Case("draft_slot_S", _set("out_cache_loc", 8, S), "draft_slot", {2}),
    Case("prefix_slot_int64_2p40", _set("kv_indices", 0, 2**40, torch.int64), "kv_slot", {0}),
    Case("all_prefix_slots_negative", _replace("kv_indices", lambda vb, t: torch.full_like(t, -7)), "kv_slot", {0, 1, 2}),
    Case("kv_indptr_start_negative", _set("kv_indptr", 0, -5), "kv_range", {0, 1, 2}, void=True),
    Case("kv_indptr_int64_2p62", _set("kv_indptr", 1, 2**62, torch.int64), "kv_order", {0, 1, 2}, void=True),
    Case("kv_indptr_int32_min", _set("kv_indptr", 1, -(2**31)), "kv_order", {0, 1, 2}, void=True),
    Case("mask_indptr_negative", _set("mask_indptr", 0, -1000), "mask_range", {0}),
    Case("mask_indptr_int64_max", _set("mask_indptr", slice(1, None), 2**63 - 1), "mask_range", {1, 2}),
    Case("mask_indptr_decreasing", _many(_set("mask_indptr", 1, 37), _set("mask_indptr", 2, 27)), "mask_indptr_order", {1, 2}),
    Case("qlen_mask_too_short", _replace("tree_mask", lambda vb, t: t[:20]), "mask_range", {2}, layout="qlen"),
    Case("packed_mask_too_short", _replace("tree_mask", lambda vb, t: t[:6]), "mask_range", {2}, layout="packed"),
    Case("packed_uint8_with_9_drafts", _replace("tree_mask", lambda vb, t: t.to(torch.uint8)), "mask_width", {2},
         layout="packed", batch=dict(drafts=[3, 2, 9])),
    Case("packed_request_of_75_drafts", _packed_long_request, "mask_width", {2}, void=True, layout="packed",
         batch=dict(pad_rows=80)),
    Case("max_draft_len_exceeded", lambda vb, kw: None, "draft_count", set(), max_draft_len=3),
]
CASES_BY_NAME = {c.name: c for c in CASES}


def _batch(case: Case, device: str, seed: int = 1):
    from ddtree_op.synthetic import make_verify_batch

    spec = dict(BASE, **case.batch)
    return make_verify_batch(spec["prefix"], spec["drafts"], spec["heads"], pad_rows=spec["pad_rows"], layout=case.layout,
                             device=device, seed=seed)


def _request_rows(vb) -> list[range]:
    qo = vb.qo_indptr.tolist()
    return [range(qo[b], qo[b + 1]) for b in range(len(qo) - 1)]


def run_case(case: Case, device: str, backend: str) -> None:
    """One bad step, then one valid step, in this process; raises AssertionError on a failure."""
    import ddtree_op
    from conftest import brute_force_verify, relative_error

    vb = _batch(case, device)
    kwargs = vb.kwargs()
    case.mutate(vb, kwargs)
    call = dict(kwargs, max_draft_len=case.max_draft_len)

    status = ddtree_op.new_status(device)
    good_out, good_lse = ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), backend=backend, status=status)
    assert decode(status) == [], f"the valid batch's status is not clean: {decode(status)}"
    out, lse = ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **call, backend=backend, status=status)
    if device == "cuda":
        torch.cuda.synchronize()

    faults = decode(status)
    assert faults and faults[0][0] == case.kind, f"status records {faults}, expected first kind {case.kind!r}"
    try:
        ddtree_op.raise_on_status(status)
    except ValueError as error:
        raised = str(error)
    else:
        raise AssertionError("raise_on_status did not raise")
    argument = ddtree_op.status.FAULTS[ddtree_op.status.KIND_INDEX[case.kind]][1]
    assert f"argument '{argument}'" in raised, raised
    try:
        ddtree_op.check_verify_inputs(vb.q, vb.kv_cache, **call)
    except ValueError as error:
        assert str(error) == raised, f"check_verify_inputs: {error}\nraise_on_status:    {raised}"
    else:
        raise AssertionError("check_verify_inputs accepted the bad value")
    assert ddtree_op.status.check_status_tensor(status) is None and not status[ddtree_op.status.WORKSPACE:].any(), \
        "the launch left its status workspace dirty"

    out, lse, good_out, good_lse = (t.float().cpu() for t in (out, lse, good_out, good_lse))
    assert not out.isnan().any() and not lse.isnan().any(), "NaN in the output of a bad step"
    # Other requests keep their keys; on a GPU a schedule planned from the lengths may still split
    # their keys elsewhere (another summation order), so compare at bf16 precision there.
    tolerance = dict(atol=1e-6, rtol=0) if device == "cpu" else dict(atol=2e-2, rtol=2e-2)
    for b, rows in enumerate(_request_rows(vb)):
        rows = list(rows)
        if b not in case.affected:
            assert torch.allclose(out[rows], good_out[rows], **tolerance), f"request {b} changed"
            assert torch.equal(lse[rows].isinf(), good_lse[rows].isinf()), f"request {b} changed"
        elif case.void:
            assert (out[rows] == 0).all() and (lse[rows] == float("-inf")).all(), f"request {b} is not void"
    pad = list(range(vb.qo_indptr.tolist()[-1], vb.q.shape[0]))
    assert (out[pad] == 0).all() and (lse[pad] == float("-inf")).all(), "padding rows"

    # A valid call afterwards, in the same process, on another batch.
    fresh = _batch(Case("valid", None, "", layout=case.layout), device, seed=7)
    valid_out, _ = ddtree_op.mla_tree_verify(fresh.q, fresh.kv_cache, **fresh.kwargs(), backend=backend, status=status)
    ref_out, _ = brute_force_verify(fresh)
    assert decode(status) == [], f"status after a valid call: {decode(status)}"
    err = relative_error(valid_out.cpu(), ref_out)
    assert err < 1e-2, f"valid call after the bad one: relative error {err}"


def decode(status):
    import ddtree_op

    return ddtree_op.decode_status(status)


def _subprocess_result(name: str, device: str, backend: str) -> str | None:
    """None if the case passed in a fresh process, else what went wrong."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", name, "--device", device, "--backend", backend]
    if device == "cpu":
        cmd += ["--memory-limit", str(MEMORY_LIMIT_BYTES)]
    env = dict(os.environ)
    env.pop("DDTREE_CHECK", None)
    if device == "cpu":  # few threads: each maps a stack and a malloc arena inside the limit
        env.update(OMP_NUM_THREADS="2", MALLOC_ARENA_MAX="2")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if result.returncode == 0 and f"case {name}: ok" in result.stdout:
        return None
    return f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _run_in_subprocess(name: str, device: str, backend: str) -> None:
    failure = _subprocess_result(name, device, backend)
    assert failure is None, failure


# ---- pytest -----------------------------------------------------------------------------------

import pytest  # noqa: E402

NAMES = [c.name for c in CASES]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CPU-only machine: GPU tests skipped)")


def test_cases_cover_the_table_and_ten_more():
    assert len(CASES) >= 10 + 10 and len(set(NAMES)) == len(NAMES)
    assert {c.kind for c in CASES} == {name for name, _, _ in __import__("ddtree_op").status.FAULTS}


@pytest.fixture(scope="module")
def cpu_results():
    """Every CPU case, each in its own process, a few at a time (most of a case is importing torch)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(NAMES, pool.map(lambda name: _subprocess_result(name, "cpu", "auto"), NAMES)))


@pytest.mark.parametrize("name", NAMES)
def test_bad_value_cpu_in_subprocess(name, cpu_results):
    assert cpu_results[name] is None, cpu_results[name]


@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "sm90"])
@pytest.mark.parametrize("name", NAMES)
def test_bad_value_gpu_in_subprocess(name, backend):
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 backend needs a compute capability 9.0 GPU")
    _run_in_subprocess(name, "cuda", backend)


def _gpu_backends():
    return ["triton", pytest.param("sm90", marks=pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU"))]


@needs_cuda
@pytest.mark.parametrize("backend", _gpu_backends())
def test_status_in_replayed_cuda_graph(backend):
    """A captured step: a replay with a bad value sets the status, the next one with good values
    clears it (the launch resets it on the device), and its output is right again."""
    import ddtree_op
    from conftest import brute_force_verify, relative_error

    vb = _batch(Case("valid", None, ""), "cuda")
    buffers = {k: v.clone() for k, v in vb.kwargs().items() if isinstance(v, torch.Tensor)}
    sm_scale = vb.sm_scale
    status = ddtree_op.new_status("cuda")
    out = torch.empty(vb.q.shape[0], vb.q.shape[1], 512, dtype=vb.q.dtype, device="cuda")
    lse = torch.empty(vb.q.shape[0], vb.q.shape[1], device="cuda")

    def step():
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **buffers, sm_scale=sm_scale, mask_layout="full", out=out, lse=lse,
                                  backend=backend, status=status)

    from gpu_cases import capture

    graph, _ = capture(step)
    ref_out, _ = brute_force_verify(vb)
    good = {k: v.clone() for k, v in buffers.items()}
    for bad_name, index, value, kind in [("kv_indices", 1, 2**31 - 1, "kv_slot"), ("qo_indptr", 3, 10**6, "qo_rows"),
                                         ("kv_indptr", 2, 4, "kv_order")]:
        graph.replay()
        torch.cuda.synchronize()
        assert decode(status) == [] and relative_error(out.cpu(), ref_out) < 1e-2
        buffers[bad_name][index] = value
        graph.replay()
        torch.cuda.synchronize()
        assert decode(status)[0][0] == kind, decode(status)
        with pytest.raises(ValueError, match=f"argument '{ddtree_op.status.FAULTS[ddtree_op.status.KIND_INDEX[kind]][1]}'"):
            ddtree_op.raise_on_status(status)
        buffers[bad_name].copy_(good[bad_name])
    graph.replay()
    torch.cuda.synchronize()
    assert decode(status) == [] and relative_error(out.cpu(), ref_out) < 1e-2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_status_under_torch_compile(device):
    import ddtree_op

    case = CASES_BY_NAME["kv_indptr_decreasing"]
    vb = _batch(case, device)
    kwargs = vb.kwargs()
    case.mutate(vb, kwargs)

    def step(q, kv_cache, status, **kw):
        out, lse = ddtree_op.mla_tree_verify(q, kv_cache, **kw, status=status)
        return out * 2, lse

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    status = ddtree_op.new_status(device)
    eager_status = ddtree_op.new_status(device)
    got, _ = compiled(vb.q, vb.kv_cache, status, **kwargs)
    want, _ = step(vb.q, vb.kv_cache, eager_status, **kwargs)
    assert torch.equal(status, eager_status) and decode(status)[0][0] == "kv_order"
    assert torch.equal(got, want)
    compiled(vb.q, vb.kv_cache, status, **vb.kwargs())  # the valid batch clears it
    assert decode(status) == []


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_opcheck_prepare_verify_with_status(device):
    import ddtree_op
    from ddtree_op import ops
    from ddtree_op.api import mask_words_per_row

    for name in ("prefix_slot_minus_1", "qo_indptr_decreasing", "mask_too_short", "max_draft_len_exceeded"):
        case = CASES_BY_NAME[name]
        vb = _batch(case, device)
        kw = vb.kwargs()
        case.mutate(vb, kw)
        rows = vb.q.shape[0]
        words = mask_words_per_row(kw["tree_mask"], case.layout, rows, case.max_draft_len)
        status = ddtree_op.new_status(device)
        status[: ddtree_op.status.WORKSPACE].random_(0, 100)  # written, not read: opcheck sees a stale value change
        prepare = (kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"], kw["mask_indptr"],
                   case.layout, rows, words, vb.kv_cache.shape[0], case.max_draft_len or 0, status)
        torch.library.opcheck(ops.prepare_verify, prepare)
        # The verify step's halves: the keys left in the workspace, then published by the attention op.
        torch.library.opcheck(ops.prepare_verify, prepare, {"publish_status": False})
        vi, vx, mw, qo = ops.prepare_verify(*prepare, publish_status=False)
        torch.library.opcheck(ops.tree_attention, (vb.q, vb.kv_cache.view(-1, 576), qo, vi, vx, mw, vb.sm_scale),
                              {"status": status})


@needs_cuda
@pytest.mark.parametrize("layout", ["full", "qlen", "packed"])
def test_cuda_preparation_sanitizes_exactly_as_the_cpu(layout):
    """Bit for bit: sanitized outputs and the status, CUDA launch against the CPU program."""
    import ddtree_op
    from ddtree_op import ops
    from ddtree_op.api import mask_words_per_row

    for case in [c for c in CASES if c.layout == layout]:
        results = []
        for device in ("cuda", "cpu"):
            vb = _batch(case, device)
            kw = vb.kwargs()
            case.mutate(vb, kw)
            rows = vb.q.shape[0]
            words = mask_words_per_row(kw["tree_mask"], layout, rows, case.max_draft_len)
            status = ddtree_op.new_status(device)
            got = ops.prepare_verify(kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"],
                                     kw["mask_indptr"], layout, rows, words, vb.kv_cache.shape[0], case.max_draft_len or 0,
                                     status)
            results.append([t.cpu() for t in got] + [status.cpu()])
        (vi, vx, mw, qo, st), (wvi, wvx, wmw, wqo, wst) = results
        total = int(wvi[-1])
        assert torch.equal(vi, wvi) and torch.equal(qo, wqo) and torch.equal(mw, wmw), case.name
        assert torch.equal(vx[:total], wvx[:total]), case.name
        assert torch.equal(st, wst), (case.name, st.tolist(), wst.tolist())


def _prepare_case(case, device, status, publish_status=True):
    """prepare_verify over the case's bad batch on `device`, recording into `status`."""
    from ddtree_op import ops
    from ddtree_op.api import mask_words_per_row

    vb = _batch(case, device)
    kw = vb.kwargs()
    case.mutate(vb, kw)
    rows = vb.q.shape[0]
    words = mask_words_per_row(kw["tree_mask"], case.layout, rows, case.max_draft_len)
    prepared = ops.prepare_verify(kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"],
                                  kw["mask_indptr"], case.layout, rows, words, vb.kv_cache.shape[0], case.max_draft_len or 0,
                                  status, publish_status=publish_status)
    return vb, prepared


def _status_at(offset, device="cpu"):
    """A status at word `offset` of a larger buffer, its head stale (written by the call); with an
    odd offset its keys start one word later (8-byte alignment)."""
    import ddtree_op

    size = ddtree_op.status.STATUS_SIZE
    status = torch.zeros(size + 1, dtype=torch.int32, device=device)[offset:offset + size]
    status[: ddtree_op.status.WORKSPACE] = 7
    return status


@pytest.mark.parametrize("offset", [0, 1])
def test_status_left_in_keys_then_published_is_the_status_published_at_once(offset):
    """The verify step's way (the preparation leaves a key per kind, the attention op publishes
    them) against the preparation op alone, bit for bit, on every case (CPU)."""
    import ddtree_op

    for case in CASES:
        want = ddtree_op.new_status()
        _prepare_case(case, "cpu", want)
        status = _status_at(offset)
        _prepare_case(case, "cpu", status, publish_status=False)
        workspace = ddtree_op.status.WORKSPACE
        assert (status[:workspace] == 7).all() and status[workspace:].any(), case.name  # keys, not yet published
        ddtree_op.status.publish(status)
        assert torch.equal(status, want), (case.name, status.tolist(), want.tolist())
        ddtree_op.status.publish(status)  # cleared keys: a clean step
        assert ddtree_op.decode_status(status) == [] and not status[workspace:].any(), case.name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_status_of_a_step_without_rows(device):
    """No rows (T_pad = 0): no attention kernel is launched, the status is still published."""
    import ddtree_op
    from ddtree_op.synthetic import make_verify_batch

    vb = make_verify_batch([], [], 2, device=device)
    assert vb.q.shape[0] == 0
    status = ddtree_op.new_status(device)
    past = vb.kv_indices.numel() + 3
    kw = dict(vb.kwargs(), kv_indptr=torch.tensor([past], dtype=vb.kv_indptr.dtype, device=device))  # past kv_indices
    ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kw, status=status)
    assert [kind for kind, _, _ in ddtree_op.decode_status(status)] == ["kv_range"]
    assert status[ddtree_op.status.VALUE] == past and not status[ddtree_op.status.WORKSPACE:].any()
    ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), status=status)
    assert ddtree_op.decode_status(status) == []


def _gpu_status_backends():
    return ["triton", "reference", pytest.param("sm90", marks=pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU"))]


@needs_cuda
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("backend", _gpu_status_backends())
def test_verify_step_status_on_cuda_is_the_cpu_status(backend, offset):
    """mla_tree_verify on CUDA (the attention launch publishes) against the CPU, bit for bit: every
    word of the status, the value of the first fault included, the workspace left zeroed."""
    import ddtree_op

    for case in CASES:
        results = []
        for device in ("cuda", "cpu"):
            vb = _batch(case, device)
            kw = vb.kwargs()
            case.mutate(vb, kw)
            status = _status_at(offset, device)
            ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kw, max_draft_len=case.max_draft_len,
                                      backend=backend if device == "cuda" else "auto", status=status)
            results.append(status.cpu())
        assert torch.equal(results[0], results[1]), (case.name, results[0].tolist(), results[1].tolist())


def _sm90_only():
    return pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                              reason="needs an sm_90 GPU")


@needs_cuda
@_sm90_only()
@pytest.mark.parametrize("schedule", ["split", "persistent"])
def test_both_sm90_kernels_publish_the_status(schedule):
    """Each sm90 instantiation publishes (its first CTA), also where that CTA attends nothing
    (a batch without draft rows: the split kernel's padding block, the persistent CTA without
    segments); then a clean preparation's status is clean."""
    import ddtree_op
    from ddtree_op.backends.sm90.attention import tree_attention_sm90

    no_rows = Case("no_draft_rows", _set("kv_indices", 2, 10**6), "kv_slot", batch=dict(drafts=[0, 0, 0], pad_rows=3))
    for case in CASES + [no_rows]:
        want = ddtree_op.new_status()
        _prepare_case(case, "cpu", want)
        for clean in (False, True):
            status = _status_at(1, "cuda")
            run = Case("valid", lambda vb, kw: None, "", batch=case.batch, layout=case.layout) if clean else case
            vb, (vi, vx, mw, qo) = _prepare_case(run, "cuda", status, publish_status=False)
            out = torch.empty(vb.q.shape[0], vb.q.shape[1], 512, dtype=vb.q.dtype, device="cuda")
            lse = torch.empty(vb.q.shape[0], vb.q.shape[1], device="cuda")
            tree_attention_sm90(vb.q, vb.kv_cache.view(-1, 576), qo, vi, vx, mw, vb.sm_scale, out, lse, schedule=schedule,
                                status=status)
            got = status.cpu()
            if clean:
                assert ddtree_op.decode_status(got) == [] and not got[ddtree_op.status.WORKSPACE:].any(), case.name
            else:
                assert torch.equal(got, want), (case.name, schedule, got.tolist(), want.tolist())


@needs_cuda
@pytest.mark.parametrize("backend", _gpu_backends())
def test_paged_status_in_replayed_cuda_graph(backend):
    """The paged entry point captured: a replay with a page id out of range sets the status (the
    attention launch publishes it), the next replay with the table repaired clears it."""
    import ddtree_op
    from gpu_cases import capture
    from ddtree_op.synthetic_paged import make_paged_batch

    pb = make_paged_batch([100, 30, 7], [6, 4, 2], 2, page_size=16, seed=5, pad_rows=2, device="cuda")
    kw = pb.kwargs()
    status = ddtree_op.new_status("cuda")
    out = torch.empty(pb.q.shape[0], pb.q.shape[1], 512, dtype=pb.q.dtype, device="cuda")
    lse = torch.empty(pb.q.shape[0], pb.q.shape[1], device="cuda")
    graph, _ = capture(lambda: ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **kw, out=out, lse=lse, backend=backend,
                                                               status=status))
    good = kw["block_table"].clone()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert decode(status) == []
        want = ddtree_op.new_status()
        kw["block_table"][0, 2] = pb.kv_cache.shape[0]
        cpu_kw = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        ddtree_op.mla_tree_verify_paged(pb.q.cpu(), pb.kv_cache.cpu(), **cpu_kw, status=want)
        graph.replay()
        torch.cuda.synchronize()
        assert decode(want) and torch.equal(status.cpu(), want), (status.tolist(), want.tolist())
        kw["block_table"].copy_(good)


def test_triton_kernel_reads_no_slot_minus_one_in_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed")
    numpy = pytest.importorskip("numpy")
    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip("Triton 3.6's interpreter fails on numpy >= 2.4")
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--interpret-triton"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0 and "interpreter: bad values ok" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]


def _interpret_triton() -> None:
    """Sanitized bad batches through the Triton kernel under the interpreter, which raises on an
    out-of-bounds pointer: same output as the reference on the same sanitized inputs."""
    import ddtree_op
    from ddtree_op import ops
    from ddtree_op.api import mask_words_per_row
    from ddtree_op.backends.triton.attention import tree_attention_triton

    for name in ("prefix_slot_minus_1", "all_prefix_slots_negative", "kv_indptr_decreasing", "qo_indptr_end_1e9",
                 "packed_request_of_75_drafts", "mask_indptr_past_mask_end"):
        case = CASES_BY_NAME[name]
        vb = _batch(case, "cpu")
        kw = vb.kwargs()
        case.mutate(vb, kw)
        q = vb.q.half()
        kv = vb.kv_cache.half()
        rows = q.shape[0]
        words = mask_words_per_row(kw["tree_mask"], case.layout, rows, None)
        prepare = (kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"], kw["out_cache_loc"], kw["tree_mask"], kw["mask_indptr"],
                   case.layout, rows, words, kv.shape[0], 0)
        want_status = ddtree_op.new_status()
        vi, vx, mw, qo = ops.prepare_verify(*prepare, want_status)
        ref_out, ref_lse = ops.tree_attention(q, kv, qo, vi, vx, mw, vb.sm_scale)
        for splits, offset in ((1, 0), (3, 1)):
            status = _status_at(offset)  # the kernel's last program publishes what the preparation left
            ops.prepare_verify(*prepare, status, publish_status=False)
            out = torch.full_like(ref_out, float("nan"))
            lse = torch.full_like(ref_lse, float("nan"))
            tree_attention_triton(q, kv, qo, vi, vx, mw, vb.sm_scale, out, lse, block_m=16, block_n=16, num_splits=splits,
                                  status=status)
            assert torch.equal(status, want_status), (name, status.tolist(), want_status.tolist())
            assert not out.isnan().any() and not lse.isnan().any(), name
            assert torch.allclose(out.float(), ref_out.float(), atol=2e-3), name
            assert torch.equal(lse.isinf(), ref_lse.isinf()), name
            finite = ref_lse.isfinite()
            assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-3), name
        print(f"interpreter: {name} ok")
    print("interpreter: bad values ok")


def limit_address_space(extra_bytes: int) -> None:
    """At most `extra_bytes` of address space beyond what the process maps now: a CUDA build of
    torch maps several GB at import, so a fixed limit would fail every allocation there."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:
        mapped = 0
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = mapped + extra_bytes if hard == resource.RLIM_INFINITY else min(mapped + extra_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=NAMES)
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--memory-limit", type=int, default=0)
    parser.add_argument("--interpret-triton", action="store_true")
    args = parser.parse_args()
    if args.memory_limit:
        limit_address_space(args.memory_limit)
    if args.interpret_triton:
        _interpret_triton()
        return 0
    for name in NAMES if args.all else [args.case]:
        run_case(CASES_BY_NAME[name], args.device, args.backend)
        print(f"case {name}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
