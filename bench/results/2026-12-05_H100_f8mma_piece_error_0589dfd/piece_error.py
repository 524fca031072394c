# O's and lse's error against one piece's length (split kernel, one split), FP8 cache.
import sys
import torch
sys.path.insert(0, "tests")
from conftest import relative_error
from gpu_cases import run_sm90
from ddtree_op import mla_tree_verify
from ddtree_op.synthetic import make_verify_batch
from ddtree_op.synthetic_paged import fp8_cache

for prefix in (8192, 32768, 65536, 131072):
    vb = make_verify_batch([prefix], [16], 16, device="cuda", layout="full", seed=2)
    vb.kv_cache = fp8_cache(vb.kv_cache.float(), 0.03, "fp8")
    ref, ref_lse = mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), kv_scale=0.03, backend="reference")
    for splits in (1, 2, 4):
        out, lse = run_sm90(vb, schedule="split", num_splits=splits, kv_scale_value=0.03)
        err = relative_error(out.float().cpu(), ref.float().cpu())
        print(f"P{prefix} splits {splits}: out {err:.2e}, lse max {(lse - ref_lse).abs().max().item():.1e}", flush=True)
