"""The argument-level part of bounds safety: DDTREE_CHECK's values, a huge sm_scale, the
inference-only ops, the status argument and the status helpers."""

import warnings

import pytest
import torch

import ddtree_op
from conftest import needs_cuda
from ddtree_op import environment
from ddtree_op.checks import MAX_ABS_SM_SCALE
from ddtree_op.synthetic import make_verify_batch

DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.fixture
def env(monkeypatch):
    environment.reset()
    yield monkeypatch
    environment.reset()


def _bad_batch(device="cpu"):
    vb = make_verify_batch([6, 3], [3, 2], 2, pad_rows=1, device=device)
    kwargs = vb.kwargs()
    kwargs["kv_indices"] = kwargs["kv_indices"].clone().fill_(10**6)
    return vb, kwargs


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " On "])
def test_ddtree_check_accepts_truthy_values(env, value):
    env.setenv("DDTREE_CHECK", value)
    vb, kwargs = _bad_batch()
    with pytest.raises(ValueError, match="argument 'kv_indices'"):
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kwargs)


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", ""])
def test_ddtree_check_off_values(env, value):
    env.setenv("DDTREE_CHECK", value)
    vb, kwargs = _bad_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kwargs)  # sanitized, no error


def test_ddtree_check_other_values_warn_once(env):
    env.setenv("DDTREE_CHECK", "enabled")
    vb, kwargs = _bad_batch()
    with pytest.warns(UserWarning, match="DDTREE_CHECK='enabled'"):
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **kwargs)  # once per process


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [3e38, -3e38, 1e30])
def test_huge_sm_scale_is_rejected_naming_it(device, scale):
    vb = make_verify_batch([6, 3], [3, 2], 2, device=device)
    with pytest.raises(ValueError, match="argument 'sm_scale'"):
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **dict(vb.kwargs(), sm_scale=scale))


@pytest.mark.parametrize("device", DEVICES)
def test_largest_accepted_sm_scale_gives_no_nan(device):
    vb = make_verify_batch([6, 3], [3, 2], 2, device=device)
    for scale in (MAX_ABS_SM_SCALE, -MAX_ABS_SM_SCALE):
        out, lse = ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **dict(vb.kwargs(), sm_scale=scale))
        assert not out.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_attention_ops_are_inference_only(device):
    vb = make_verify_batch([6, 3], [3, 2], 2, device=device)
    q = vb.q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only"):
        ddtree_op.mla_tree_verify(q, vb.kv_cache, **vb.kwargs())
    with torch.no_grad():
        ddtree_op.mla_tree_verify(q, vb.kv_cache, **vb.kwargs())
    with torch.inference_mode():
        ddtree_op.mla_tree_verify(q, vb.kv_cache, **vb.kwargs())


@pytest.mark.parametrize("bad", [torch.zeros(ddtree_op.status.STATUS_SIZE, dtype=torch.int64), torch.zeros(8, dtype=torch.int32),
                                 torch.zeros(32, dtype=torch.int32),
                                 torch.zeros(2 * ddtree_op.status.STATUS_SIZE, dtype=torch.int32)[::2], "status"])
def test_status_argument_is_checked(bad):
    vb = make_verify_batch([6, 3], [3, 2], 2)
    with pytest.raises(ValueError, match="argument 'status'"):
        ddtree_op.mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), status=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_prepare_op_checks_its_status_argument(device):
    vb = make_verify_batch([6, 3], [3, 2], 2, device=device)
    bad = [torch.zeros(16, dtype=torch.int32, device=device)]
    if device == "cuda":
        bad.append(torch.zeros(ddtree_op.status.STATUS_SIZE, dtype=torch.int32))  # right size, on the CPU
    for status in bad:
        with pytest.raises((ValueError, RuntimeError), match="argument 'status'"):
            torch.ops.ddtree.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                            vb.mask_indptr, "full", vb.q.shape[0], 1, vb.kv_cache.shape[0], 0, status)


_RAW_PREPARE_WITH_STATUS = """
import sys, torch
from ddtree_op import build
from ddtree_op.synthetic import make_verify_batch
build.load_cuda_library()
vb = make_verify_batch([6, 3], [3, 2], 2, device="cuda")
status = {"short": torch.zeros(32, dtype=torch.int32, device="cuda"), "int64": torch.zeros(48, dtype=torch.int64, device="cuda"),
          "cpu": torch.zeros(48, dtype=torch.int32)}[sys.argv[1]]
try:
    torch.ops.ddtree_cuda.prepare_verify(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask,
                                         vb.mask_indptr, "full", vb.q.shape[0], 1, vb.kv_cache.shape[0], 0, status, None, 0, 0, 0,
                                         True)
except RuntimeError as error:
    print("raised:", str(error).splitlines()[0])
torch.cuda.synchronize()
print("alive")
"""


@needs_cuda
@pytest.mark.parametrize("bad", ["short", "int64", "cpu"])
def test_raw_cuda_prepare_op_raises_on_a_bad_status(bad):
    # The CUDA op itself, without the Python check in front of it, in a process of its own: a crash
    # fails this test instead of the run.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _RAW_PREPARE_WITH_STATUS, bad], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "raised: ddtree_op: argument 'status'" in output and "alive" in output, output[-3000:]


def test_raise_on_status_is_silent_on_a_clean_step_and_names_every_kind():
    status = ddtree_op.new_status()
    ddtree_op.raise_on_status(status)
    assert ddtree_op.decode_status(status) == []
    for kind, (name, argument, _) in enumerate(ddtree_op.status.FAULTS):
        status.zero_()
        status[0], status[1], status[2], status[3] = 1 << kind, kind, 5, 7
        status[ddtree_op.status.POSITIONS + kind] = 5
        with pytest.raises(ValueError, match=f"ddtree_op: argument '{argument}'"):
            ddtree_op.raise_on_status(status)
        assert ddtree_op.decode_status(status) == [(name, argument, 5)]


def test_status_layout_agrees_with_the_cuda_header():
    import re
    from pathlib import Path

    header = (Path(__file__).parents[1] / "cutlass_kernels" / "status.cuh").read_text()
    constants = {name: int(value) for name, value in re.findall(r"\b(k\w+) = (-?\d+)", header)}
    s = ddtree_op.status
    assert constants["kStatusSize"] == s.STATUS_SIZE
    assert (constants["kStatusBits"], constants["kStatusKind"], constants["kStatusPosition"], constants["kStatusValue"],
            constants["kStatusPositions"], constants["kStatusWorkspace"]) == (s.BITS, s.KIND, s.POSITION, s.VALUE, s.POSITIONS,
                                                                        s.WORKSPACE)
    enum = re.search(r"enum Fault : int \{(.*?)\};", header, re.S).group(1)
    names = re.findall(r"\bk(\w+) = (\d+),", enum)
    assert [int(v) for _, v in names] == list(range(s.NUM_FAULTS)) + [s.NUM_FAULTS]
    camel = [n for n, _ in names][: s.NUM_FAULTS]
    assert [n.lower() for n in camel] == [name.replace("_", "") for name, _, _ in s.FAULTS]


def test_raise_on_status_renames_arguments_for_wrappers():
    status = ddtree_op.new_status()
    kind = ddtree_op.status.KIND_INDEX["mask_range"]
    status[0], status[1], status[2], status[3] = 1 << kind, kind, 1, 40
    with pytest.raises(ValueError, match="argument 'custom_mask' has 40 entries"):
        ddtree_op.raise_on_status(status, names={"tree_mask": "custom_mask"})


def _sglang_call(**overrides):
    from sglang_metadata import build_target_verify

    inp = build_target_verify([37, 5], 4, heads=2)
    kw = dict(qo_indptr=inp.qo_indptr, kv_indptr=inp.kv_indptr, kv_indices=inp.kv_indices, custom_mask=inp.custom_mask,
              mask_indptr=inp.mask_indptr, out_cache_loc=inp.out_cache_loc, sm_scale=inp.sm_scale, num_draft_tokens=4)
    q = overrides.pop("q", inp.q)
    k_buffer = overrides.pop("k_buffer", inp.k_buffer)
    kw.update(overrides)
    return inp, q, k_buffer, kw


@pytest.mark.parametrize("argument,override", [
    ("custom_mask", lambda inp: dict(custom_mask=inp.custom_mask.float())),
    ("num_draft_tokens", lambda inp: dict(num_draft_tokens=0)),
    ("k_buffer", lambda inp: dict(k_buffer=inp.k_buffer.half())),
    ("q", lambda inp: dict(q=inp.q.reshape(-1))),
])
def test_sglang_adapter_errors_name_its_own_arguments(argument, override):
    from ddtree_op.sglang import target_verify_forward

    inp, _, _, _ = _sglang_call()
    _, q, k_buffer, kw = _sglang_call(**override(inp))
    with pytest.raises(ValueError, match=f"argument '{argument}'"):
        target_verify_forward(q, k_buffer, **kw)


def test_sglang_adapter_passes_the_status_through():
    from ddtree_op.sglang import ARGUMENT_NAMES, target_verify_forward

    inp, q, k_buffer, kw = _sglang_call()
    status = ddtree_op.new_status()
    target_verify_forward(q, k_buffer, **dict(kw, custom_mask=inp.custom_mask[:10]), status=status)
    with pytest.raises(ValueError, match="argument 'custom_mask' has 10 entries"):
        ddtree_op.raise_on_status(status, names=ARGUMENT_NAMES)
    target_verify_forward(q, k_buffer, **kw, status=status)
    ddtree_op.raise_on_status(status)
