"""A/B of the split combine: main's (scratch/combine_main.py) vs this tree's, alone and inside the op."""
import importlib.util, sys
import torch
import ddtree_op.triton_attention as cur
from bench.cases import all_cases
from bench.verify import Inputs, input_set_count, time_graph

spec = importlib.util.spec_from_file_location("ddtree_op.combine_main", "scratch/combine_main.py")  # git show 42335df:ddtree_op/triton_attention.py
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
variants = {"main": old.combine_splits, "next": cur.combine_splits}
H = 16
for splits, rows in [(9, 512), (16, 512), (9, 64), (4, 2048), (64, 64), (13, 128)]:
    sets = [(torch.randn(splits, rows, 512, device="cuda"), torch.randn(splits, rows, device="cuda")) for _ in range(8)]
    qo = torch.tensor([0, rows // H], dtype=torch.int32, device="cuda")
    out = torch.empty(rows // H, H, 512, device="cuda", dtype=torch.bfloat16); lse = torch.empty(rows // H, H, device="cuda")
    res = {}
    for name, fn in list(variants.items()) * 2:
        s = time_graph([lambda p=p, fn=fn: fn(p[0], p[1], qo, out, lse) for p in sets]); res[name] = s * 1e6
    ref_o = out.clone(); old.combine_splits(sets[0][0], sets[0][1], qo, out, lse); a = out.float().clone()
    cur.combine_splits(sets[0][0], sets[0][1], qo, out, lse); b = out.float()
    print(f"combine alone S={splits:3d} rows={rows:5d} main {res['main']:6.2f} us next {res['next']:6.2f} us  max|diff| {(a-b).abs().max().item():.2e}", flush=True)
names = sys.argv[1].split(",")
for case in all_cases():
    if case.name not in names: continue
    inputs = [Inputs(case, seed) for seed in range(input_set_count(case))]
    for name, fn in list(variants.items()) * 2:
        cur_fn = cur.combine_splits; cur.combine_splits = fn
        try: s = time_graph([i.attention("cutlass") for i in inputs])
        finally: cur.combine_splits = cur_fn
        print(f"op {case.name:26s} combine={name:5s} {s*1e6:8.1f} us", flush=True)
