"""Which implementation runs the attention op: a registry of backends that `auto` walks in order.

Each backend (a module beside this one) says on which devices it runs, whether `auto` may pick it
there, which inputs it accepts, and how to run. The choice is a function of (device, requested
backend, input class) only, so it is made once and cached: the per-call cost is one dictionary
lookup and the few stride/pointer reads of `input_class`. Environment variables that steer the
choice (DDTREE_DISABLE_SM90) are read once per process (environment.py);
`reset_dispatch_cache()` forgets every choice and what was read (tests use it after changing
the environment).

Backends never import one another; what two of them share lives in `lse_merge.py` (the combine of
split partials) and `splits.py` (the shape-only split count).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from .. import build, environment
from ..contract import BACKEND_CHOICES, DEPRECATED_BACKENDS
from ..environment import DISABLE_SM90_ENV
from . import reference, sm90, triton
from .splits import sm_count

# "auto" takes the first backend in this order that it may use on the device and that accepts the
# inputs: the sm_90a kernel where it runs, else the Triton kernel on CUDA, else the reference.
AUTO_ORDER = ("sm90", "triton", "reference")


@dataclass(frozen=True)
class InputClass:
    """What the choice of a backend depends on besides the device: a few bits of the inputs."""

    dtype: torch.dtype  # of q
    kv_dtype: torch.dtype
    rows_16b_aligned: bool  # q, KV and out rows start on 16 bytes (pointer and strides)


def input_class(q: torch.Tensor, kv_rows: torch.Tensor, out: torch.Tensor) -> InputClass:
    return InputClass(q.dtype, kv_rows.dtype, sm90.sm90_accepts(q, kv_rows, out))


@dataclass(frozen=True)
class Backend:
    name: str
    unavailable: Callable[[torch.device], str | None]  # why it cannot run on the device, or None
    auto: Callable[[torch.device], bool]  # may "auto" pick it on the device
    accepts: Callable[[InputClass], bool]
    run: Callable[..., None]  # (q, kv_rows, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse)
    reads_plan: bool = False  # run takes the preparation's schedule plan (plan=)
    # run takes the status (status=) and its kernel publishes it in every launch over at least one
    # row (what the preparation before it left: cutlass_kernels/status.cuh)
    publishes_status: bool = False


def _needs_cuda(name: str) -> Callable[[torch.device], str | None]:
    def unavailable(device: torch.device) -> str | None:
        if device.type != "cuda":
            return f"ddtree_op: backend {name!r} needs CUDA tensors; on {device} only the reference runs"
        return None

    return unavailable


def sm90_kernel_available(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def _sm90_unavailable(device: torch.device) -> str | None:
    reason = _needs_cuda("sm90")(device)
    if reason is None and not sm90_kernel_available(device):
        capability = ".".join(map(str, torch.cuda.get_device_capability(device)))
        reason = (f"ddtree_op: backend 'sm90' (the sm_90a kernel) needs a compute capability 9.0 GPU; {device} is "
                  f"{capability}: use backend='triton' or 'auto'")
    return reason


@functools.lru_cache(maxsize=None)
def _warn_no_cutlass_headers() -> None:
    warnings.warn("ddtree_op: this GPU runs the sm_90a kernel, but the CUTLASS headers it is built with are not "
                  "installed (`pip install --no-deps nvidia-cutlass`); backend 'auto' uses the slower Triton kernel")


def _sm90_auto(device: torch.device) -> bool:
    """The sm_90a kernel on compute capability 9.0 when its JIT build can find the CUTLASS headers
    (with a warning, once, where only the headers are missing), unless DDTREE_DISABLE_SM90=1 (an
    escape hatch for serving if the JIT build of the sm_90a library is not wanted)."""
    if device.type != "cuda" or environment.flag(DISABLE_SM90_ENV) or not sm90_kernel_available(device):
        return False
    if not build.cutlass_headers_available():
        _warn_no_cutlass_headers()
        return False
    return True


def _always(*_) -> bool:
    return True


REGISTRY: dict[str, Backend] = {
    "reference": Backend("reference", lambda device: None, _always, _always, reference.tree_attention_reference),
    "triton": Backend("triton", _needs_cuda("triton"), lambda device: device.type == "cuda", _always, triton.run,
                      publishes_status=True),
    "sm90": Backend("sm90", _sm90_unavailable, _sm90_auto, sm90.accepts, sm90.run, reads_plan=True, publishes_status=True),
}


def auto_cuda_backend(device: torch.device) -> str:
    """The backend "auto" uses on a CUDA device for inputs every backend accepts."""
    return next(name for name in AUTO_ORDER if REGISTRY[name].auto(device))


@functools.lru_cache(maxsize=None)
def _warn_deprecated(name: str) -> None:
    warnings.warn(f"ddtree_op: backend={name!r} is deprecated; use backend={DEPRECATED_BACKENDS[name]!r} (the same "
                  "kernel)", FutureWarning, stacklevel=3)


def canonical_backend(backend: str) -> str:
    """The registry name of a `backend=` value; a deprecated alias warns once."""
    if backend in DEPRECATED_BACKENDS:
        _warn_deprecated(backend)
        return DEPRECATED_BACKENDS[backend]
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"ddtree_op: argument 'backend' must be one of {BACKEND_CHOICES}, got {backend!r}")
    return backend


@functools.lru_cache(maxsize=None)
def choose(device: torch.device, backend: str, inputs: InputClass) -> Backend:
    """The backend that runs `backend` (a canonical name or "auto") on the device for inputs of
    this class; raises where an explicitly named backend cannot run there."""
    if backend != "auto":
        chosen = REGISTRY[backend]
        reason = chosen.unavailable(device)
        if reason is not None:
            raise RuntimeError(reason)
        return chosen
    return next(REGISTRY[name] for name in AUTO_ORDER if REGISTRY[name].auto(device) and REGISTRY[name].accepts(inputs))


def reset_dispatch_cache() -> None:
    """Forgets every choice, the environment read for it and the warnings given once."""
    for cached in (choose, _warn_no_cutlass_headers, _warn_deprecated):
        cached.cache_clear()
    environment.reset()


def plan_schedule(device: torch.device, num_tokens: int, heads: int, batch: int, num_keys: int) -> tuple[int, int]:
    """(CTAs, splits per row block) of the sm90 kernels on `device` for these shapes, which the
    preparation makes the schedule plan for (a CPU counts as one SM: its plan is only a twin)."""
    sms = sm_count(device) if device.type == "cuda" else 1
    return sm90.plan_shape(sms, num_tokens, heads, batch, num_keys)


def run_tree_attention(q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse, backend,
                       kv_scale=None, kv_scale_value=1.0, plan=None, status=None) -> bool:
    """Runs the chosen backend; returns whether its launch published `status` (else the caller does)."""
    if kv_cache.dtype == torch.uint8:  # the bytes of an e4m3 cache, as SGLang stores it
        kv_cache = kv_cache.view(torch.float8_e4m3fn)
    inputs = input_class(q, kv_cache, out)
    chosen = choose(q.device, canonical_backend(backend), inputs)
    args = (q, kv_cache, qo_indptr, verify_indptr, verify_indices, mask_words, sm_scale, out, lse)
    # Only an FP8 cache carries a scale, and only backends that accept one are handed it.
    fp8 = inputs.kv_dtype == torch.float8_e4m3fn
    if fp8 and not chosen.accepts(inputs):
        raise ValueError(f"ddtree_op: backend {chosen.name!r} takes no FP8 (float8_e4m3fn) KV cache; use backend='triton', "
                         "'reference' or 'auto'")
    extra = dict(kv_scale=kv_scale, kv_scale_value=kv_scale_value) if fp8 else {}
    if chosen.reads_plan:
        extra["plan"] = plan
    published = status is not None and chosen.publishes_status and q.shape[0] > 0
    if published:
        extra["status"] = status
    if q.device.type != "cuda":
        chosen.run(*args, **extra)
        return published
    with torch.cuda.device(q.device):
        chosen.run(*args, **extra)
    return published
