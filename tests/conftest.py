import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddtree_op  # noqa: F401  (registers the ops)

@pytest.fixture
def fresh_dispatch():
    """Forgets the backend choices and the environment read for them, before the test and after;
    the test calls it again after changing the environment."""
    from ddtree_op.backends import reset_dispatch_cache

    reset_dispatch_cache()
    yield reset_dispatch_cache
    reset_dispatch_cache()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CPU-only machine: GPU tests skipped)")


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def run_interpreter_script(name: str) -> None:
    """Runs tests/<name> (a script of Triton-interpreter cases) in a fresh process with the
    checkout first on the path; it must end with "interpreter: all cases match"."""
    pytest.importorskip("triton", reason="triton is not installed: the interpreter check needs it")
    numpy = pytest.importorskip("numpy")
    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip("Triton 3.6's interpreter fails on numpy >= 2.4 (size-1 arrays as loop bounds)")
    script = Path(__file__).with_name(name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(script.parents[1]), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "interpreter: all cases match" in result.stdout


def brute_force_verify(vb) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent float64 reference straight from SGLang's inputs: one (row, head) at a time,
    reading the raw mask layout itself (no combined indices, no compact mask)."""
    q = vb.q.double().cpu()
    kv = vb.kv_cache.double().cpu().reshape(vb.kv_cache.shape[0], -1)
    qo = vb.qo_indptr.tolist()
    kvp = vb.kv_indptr.tolist()
    kv_indices = vb.kv_indices.tolist()
    out_cache_loc = vb.out_cache_loc.tolist()
    mask = vb.tree_mask.cpu()
    mask_indptr = None if vb.mask_indptr is None else vb.mask_indptr.tolist()
    tokens, heads = q.shape[0], q.shape[1]
    out = torch.zeros(tokens, heads, 512, dtype=torch.float64)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64)
    qlen_start = 0
    for b in range(len(qo) - 1):
        n = qo[b + 1] - qo[b]
        prefix = kv_indices[kvp[b] : kvp[b + 1]]
        P = len(prefix)
        drafts = out_cache_loc[qo[b] : qo[b + 1]]
        for i in range(n):
            keys = list(prefix)
            for j in range(n):
                if vb.mask_layout == "full":
                    seen = bool(mask[mask_indptr[b] + i * (P + n) + P + j])
                elif vb.mask_layout == "qlen":
                    start = mask_indptr[b] if mask_indptr is not None else qlen_start
                    seen = bool(mask[start + i * n + j])
                else:
                    width = mask.element_size() * 8
                    word = int(mask[qo[b] + i].long()) % (1 << width)
                    seen = bool((word >> j) & 1)
                if seen:
                    keys.append(drafts[j])
            for h in range(heads):
                if not keys:
                    continue
                k = kv[keys]
                scores = (k @ q[qo[b] + i, h]) * vb.sm_scale
                lse[qo[b] + i, h] = torch.logsumexp(scores, 0)
                out[qo[b] + i, h] = torch.softmax(scores, 0) @ k[:, :512]
        qlen_start += n * n
    return out, lse
