"""The split combine alone, fp32 vs bf16 partials, in CUDA graphs of 8 calls:

  PYTHONPATH=$PWD python3 bench/time_combine.py
"""

import torch

from bench.verify import time_graph
from ddtree_op.backends.lse_merge import combine_splits

HEADS = 16


def main():
    for splits, rows in [(9, 512), (16, 512), (9, 64), (4, 2048)]:
        for dtype in (torch.float32, torch.bfloat16):
            sets = [(torch.randn(splits, rows, 512, device="cuda").to(dtype), torch.randn(splits, rows, device="cuda"))
                    for _ in range(8)]
            qo_indptr = torch.tensor([0, rows // HEADS], dtype=torch.int32, device="cuda")
            out = torch.empty(rows // HEADS, HEADS, 512, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(rows // HEADS, HEADS, device="cuda")
            seconds = time_graph([lambda p=p: combine_splits(p[0], p[1], qo_indptr, out, lse) for p in sets])
            print(f"combine splits {splits:3d} rows {rows:5d} {str(dtype):15s} {seconds * 1e6:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
