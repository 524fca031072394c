"""Benchmark of the verify attention on one GPU: `python -m bench.verify [--out DIR]`.

For each shape and backend: median time over CUDA-graph replays, each replay running the op on
several input sets in turn so the L2 cache does not hold them; TFLOP/s, TB/s, fraction of speed
of light (ceilings measured in the same run) and speed-up over the SGLang-style baseline. Also
times the index builder alone, the mask conversion alone and the whole verify step in one graph.
With the preparation timed, also `per_layer[BACKEND]`: a model forward's time per layer, one
preparation and MODEL_LAYERS attentions over it (`prepare_tree_verify`, then
`mla_tree_verify_prepared` per layer, as a serving engine runs a verify step).
Writes results.json, then bench/report.py renders the table, the plot and the summary from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
from pathlib import Path
from unittest import mock

import torch

from bench.cases import Case, all_cases, grid_cases, ragged_cases, ragged_pair_cases, serving_cases
from bench.report import PREP_OP_PREFIXES, PREP_PREFIXES, write_report
from ddtree_op import mla_tree_verify, mla_tree_verify_prepared, new_status, ops, prepare_tree_verify
from ddtree_op.api import new_plan
from ddtree_op.checks import kv_rows
from ddtree_op.synthetic import make_verify_batch

L2_BYTES = 60 * 2**20
FLASHMLA_PAGE = 64
MODEL_LAYERS = 61  # DeepSeek-V3's attention layers, all MLA: one verify step prepares once for all


def flashmla_available() -> bool:
    try:
        import flash_mla  # noqa: F401
    except Exception as exc:  # a missing wheel, or one built for another torch
        print(f"flashmla column skipped: flash_mla does not import here ({exc})")
        return False
    return True


def capture_graph(launches) -> torch.cuda.CUDAGraph:
    """All `launches` captured in one CUDA graph (after a warm-up on a side stream that compiles
    kernels and loads libraries), replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for launch in launches:
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_seconds(graph: torch.cuda.CUDAGraph, count: int) -> float:
    """Mean seconds of one replay over `count` back-to-back replays, timed with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / count


def time_graphs(columns: dict, groups: int = 15, group_seconds: float = 1e-3) -> dict:
    """Median seconds of one launch for each column (name -> launches, all captured in one graph
    per column), replayed back to back in groups of about group_seconds (the GPU stays busy and
    clocked up, as in serving; one replay with a host sync in between would time an idling GPU).
    The columns take turns group by group, each round starting one column later, so that a drift
    of the clocks during the case (a long compute-bound case heats the card) weighs on all of them
    alike instead of on whichever was timed last; median over each column's groups."""
    graphs = {name: capture_graph(launches) for name, launches in columns.items()}
    per_group = {name: max(1, min(200, math.ceil(group_seconds / replay_seconds(graph, 3)))) for name, graph in graphs.items()}
    names = list(graphs)
    times = {name: [] for name in names}
    for g in range(groups):
        for k in range(len(names)):
            name = names[(g + k) % len(names)]
            times[name].append(replay_seconds(graphs[name], per_group[name]))
    del graphs
    return {name: sorted(t)[len(t) // 2] / len(columns[name]) for name, t in times.items()}


def time_graph(launches, groups: int = 15, group_seconds: float = 1e-3) -> float:
    """Median seconds of one launch of `launches` (time_graphs with one column)."""
    return time_graphs({"": launches}, groups, group_seconds)[""]


def time_eager(launch, repeats: int = 5) -> float:
    """Median seconds of an eager call (for the host-synchronizing reference, which cannot be
    captured in a graph), timed with events after one warm-up."""
    launch()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


# The float32 reference is timed only where it is quick (its loops read lengths on the host).
REFERENCE_MAX_FLOOR_US = 5.0


def measure_ceilings() -> dict:
    """Device copy (bytes read + written, best of two sizes) and an 8192^3 bf16 matmul."""
    copy_rates = []
    for numel in (1 << 29, 1 << 30):  # 2 and 4 GiB of float32 each way
        src = torch.randn(numel, device="cuda")
        dst = torch.empty_like(src)
        copy_bytes = 2 * src.numel() * 4
        copy_rates.append(copy_bytes / time_graph([lambda: dst.copy_(src)], groups=5))
        copy_rates.append(copy_bytes / time_eager(lambda: dst.copy_(src), repeats=10))
        del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_s = time_graph([lambda: torch.mm(a, b)], groups=5)
    return {"copy_bytes_per_s": max(copy_rates), "bf16_flops": 2 * 8192**3 / mm_s}


class Inputs:
    """One input set of a case on the GPU, with everything each backend needs precomputed."""

    def __init__(self, case: Case, seed: int):
        vb = make_verify_batch(list(case.prefix_lens), list(case.draft_lens), case.heads, device="cuda", seed=seed,
                               chain=case.chain, kv_cache_3d=True)
        self.vb = vb
        self.case = case
        self.seed = seed
        self.max_draft = max(case.draft_lens)
        self.rows = vb.q.shape[0]
        self.words = math.ceil(self.max_draft / 64)
        self.kv_rows = kv_rows(vb.kv_cache)
        # The step's preparation, once: the attention alone runs over it (mla_tree_verify_prepared,
        # a layer of a prepared step). The preparation column writes its plan into self.plan.
        self.plan = new_plan(vb.q, vb.qo_indptr)
        self.prepared = self.prepare_step()
        self.out = torch.empty(self.rows, case.heads, 512, device="cuda", dtype=vb.q.dtype)
        self.lse = torch.empty(self.rows, case.heads, device="cuda")
        self.kv_scale = None  # an e4m3 cache's (bench.paged_fp8.fp8_layer_inputs), passed by attend_over

    def attention(self, backend: str, **triton_config):
        vb = self.vb
        if triton_config:
            from ddtree_op.backends.triton.attention import tree_attention_triton

            return lambda: tree_attention_triton(vb.q, self.kv_rows, *self.prepared.attention_inputs(), vb.sm_scale, self.out,
                                                 self.lse, **triton_config)
        return lambda: self.attend_over(self.prepared, backend)

    def prepare_step(self, status=None):
        """This set's step prepared for its layers (prepare_tree_verify)."""
        vb = self.vb
        kwargs = vb.kwargs()
        del kwargs["sm_scale"]
        return prepare_tree_verify(vb.q, vb.kv_cache, **kwargs, max_draft_len=self.max_draft, status=status)

    def attend_over(self, prepared, backend: str):
        """One layer's attention, with this set's q and KV pool, over a prepared step."""
        vb = self.vb
        return mla_tree_verify_prepared(vb.q, vb.kv_cache, prepared, sm_scale=vb.sm_scale, out=self.out, lse=self.lse,
                                        backend=backend, kv_scale=self.kv_scale)

    def whole_step(self, backend: str):
        vb = self.vb
        return lambda: mla_tree_verify(vb.q, vb.kv_cache, **vb.kwargs(), out=self.out, lse=self.lse, backend=backend,
                                       max_draft_len=self.max_draft)

    def plain_step(self, backend: str):
        """The whole step with its kernels launched one after another (DDTREE_PDL=0 while it is
        captured), beside the step whose kernels overlap their neighbours' tails."""
        step = self.whole_step(backend)

        def launch():
            with mock.patch.dict(os.environ, {"DDTREE_PDL": "0"}):
                step()

        return launch

    def index_build(self):
        vb = self.vb
        return lambda: ops.build_verify_indices(vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc)

    def mask_convert(self):
        vb = self.vb
        return lambda: ops.convert_tree_mask(vb.tree_mask, vb.mask_indptr, vb.qo_indptr, vb.kv_indptr, "full", self.rows, self.words)

    def _prepare_args(self, status=None):
        """prepare_verify's arguments as mla_tree_verify passes them (with the plan buffer)."""
        vb = self.vb
        return (vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc, vb.tree_mask, vb.mask_indptr, "full", self.rows,
                self.words, self.kv_rows.shape[0], self.max_draft, status, self.plan, vb.q.shape[1])

    def prepare(self, status=None, publish_status=True):  # both of the above and the plan in one launch, as the whole step runs them
        args = self._prepare_args(status)
        extra = {} if publish_status else {"publish_status": False}  # an older checkout has no such argument
        return lambda: ops.prepare_verify(*args, **extra)

    def flashmla(self):
        """FlashMLA's dense decode on the same work laid out its way: each request's prefix and
        drafts in contiguous 64-row pages, a causal mask instead of the tree (a yardstick only)."""
        import flash_mla

        case, heads, n = self.case, self.case.heads, self.max_draft
        gen = torch.Generator(device="cuda").manual_seed(1000 + self.seed)
        seqlens = torch.tensor([p + n for p in case.prefix_lens], dtype=torch.int32, device="cuda")
        pages = [math.ceil((p + n) / FLASHMLA_PAGE) for p in case.prefix_lens]
        first_page = [sum(pages[:b]) for b in range(len(pages))]
        table = torch.zeros(len(pages), max(pages), dtype=torch.int32, device="cuda")
        for b, (start, count) in enumerate(zip(first_page, pages)):
            table[b, :count] = torch.arange(start, start + count, dtype=torch.int32, device="cuda")
        k_cache = torch.randn(sum(pages), FLASHMLA_PAGE, 1, 576, device="cuda", dtype=torch.bfloat16, generator=gen)
        q = torch.randn(len(pages), n, heads, 576, device="cuda", dtype=torch.bfloat16, generator=gen)
        meta, _ = flash_mla.get_mla_metadata()

        def launch():
            return flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, softmax_scale=self.vb.sm_scale,
                                                    causal=True, use_legacy=True)

        launch()  # the first call fills the schedule; captured replays reuse it
        return launch

    def paged_batch(self):
        """The same step in FlashMLA's paged layout (64-row pages; bench/paged_fp8.py), built once."""
        if not hasattr(self, "_paged"):
            from bench.paged_fp8 import paged_inputs

            self._paged = paged_inputs(self.case, seed=self.seed)
        return self._paged

    def paged_attention(self, backend: str):
        """The attention alone over the paged batch, prepared once (prepare_tree_verify_paged), as
        for the slot backends: the kernel on FlashMLA's pages, beside FlashMLA itself."""
        from ddtree_op import prepare_tree_verify_paged

        pb = self.paged_batch()
        kwargs = pb.kwargs()
        del kwargs["sm_scale"], kwargs["kv_scale"]
        prepared = prepare_tree_verify_paged(pb.q, pb.kv_cache, **kwargs, max_draft_len=self.max_draft)
        return lambda: mla_tree_verify_prepared(pb.q, pb.kv_cache, prepared, sm_scale=pb.sm_scale, out=self.out, lse=self.lse,
                                                kv_scale=pb.kv_scale, backend=backend)

    def paged_step(self, backend: str):
        import ddtree_op

        pb = self.paged_batch()
        return lambda: ddtree_op.mla_tree_verify_paged(pb.q, pb.kv_cache, **pb.kwargs(), out=self.out, lse=self.lse,
                                                       backend=backend, max_draft_len=self.max_draft)

    def sglang_extend(self):
        """SGLang's own Triton extend kernel on the same buffers (bench/sglang_triton_extend.py)."""
        from bench.sglang_triton_extend import make_sglang_triton_extend

        vb = self.vb
        return make_sglang_triton_extend(vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc,
                                         vb.tree_mask, vb.mask_indptr, vb.sm_scale, self.max_draft, self.out)

    def baseline(self):
        from bench.sglang_baseline import sglang_style_verify

        vb = self.vb
        return lambda: sglang_style_verify(vb.q, vb.kv_cache, vb.qo_indptr, vb.kv_indptr, vb.kv_indices, vb.out_cache_loc,
                                           vb.tree_mask, vb.mask_indptr, vb.sm_scale, self.max_draft, self.out)


def parse_triton_configs(text: str | None) -> dict[str, dict]:
    """'64,32,8,1;64,64,8,2,2' -> {'triton[64x32w8s1]': {...}, ...}: block_m, block_n, warps,
    stages and optionally dv_parts (programs sharing the 512 output columns)."""
    configs = {}
    for item in filter(None, (text or "").split(";")):
        bm, bn, w, s, *dv = (int(x) for x in item.split(","))
        parts = dv[0] if dv else 1
        configs[f"triton[{bm}x{bn}w{w}s{s}" + (f"v{parts}]" if parts > 1 else "]")] = dict(
            block_m=bm, block_n=bn, num_warps=w, num_stages=s, dv_parts=parts)
    return configs


def forward_launches(inputs: list[Inputs], backend: str, layers: int = MODEL_LAYERS) -> list:
    """One model forward per input set i, `layers` launches each (so that a launch's time is a
    layer's): the first prepares set i's step and runs layer 0 over it, each later one runs one
    layer over that preparation. Layer l reads the q and KV pool of set (i + l) % len(inputs)
    (same shapes, other values), so consecutive layers do not share their keys in L2, as the
    layers of a model do not. The preparation records into a status (and publishes it), as for
    an engine that reads one after the step."""
    launches = []
    for i, first in enumerate(inputs):
        step = {"status": new_status(first.vb.q.device)}

        def prepare_and_attend(first=first, step=step):
            step["prepared"] = first.prepare_step(step["status"])
            first.attend_over(step["prepared"], backend)

        launches.append(prepare_and_attend)
        for layer in range(1, layers):
            launches.append(lambda own=inputs[(i + layer) % len(inputs)], step=step: own.attend_over(step["prepared"], backend))
    return launches


def input_set_count(case: Case) -> int:
    """Input sets a graph rotates through so that together they hold ~3x the L2 cache (at most 8)."""
    return max(1, min(8, math.ceil(3 * L2_BYTES / case.bytes())))


def bench_case(case: Case, backends: list[str], triton_configs: dict, ceilings: dict, with_prep: bool,
               plain_step: bool = False) -> dict:
    sets = input_set_count(case)
    inputs = [Inputs(case, seed) for seed in range(sets)]
    floor = case.floor_seconds(ceilings["bf16_flops"], ceilings["copy_bytes_per_s"])
    row = {"case": case.name, "tags": list(case.tags), "heads": case.heads, "batch": case.batch,
           "draft": max(case.draft_lens), "prefix_max": max(case.prefix_lens), "flops": case.flops(),
           "bytes": case.bytes(), "floor_us": floor * 1e6, "input_sets": sets, "time_us": {}}
    # Every column of the case timed together (time_graphs: in turns), the whole step of each
    # backend that could be the fastest included; the step of the fastest is kept.
    columns = {}
    for backend in backends:
        if backend == "sglang_baseline":
            columns[backend] = [i.baseline() for i in inputs]
        elif backend == "flashmla":
            columns[backend] = [i.flashmla() for i in inputs]
        elif backend == "sglang_extend":
            columns[backend] = [i.sglang_extend() for i in inputs]
        elif backend.startswith("paged:"):  # paged:BACKEND, the attention alone on 64-row pages
            columns[backend] = [i.paged_attention(backend.split(":", 1)[1]) for i in inputs]
        elif backend.startswith("paged_step:"):  # paged_step:BACKEND, the whole paged step
            columns[backend] = [i.paged_step(backend.split(":", 1)[1]) for i in inputs]
        else:
            columns[backend] = [i.attention(backend) for i in inputs]
    for name, config in triton_configs.items():
        columns[name] = [i.attention("triton", **config) for i in inputs]
    step_candidates = [b for b in backends if b not in ("sglang_baseline", "sglang_extend", "reference", "flashmla") and ":" not in b]
    if with_prep:
        for b in step_candidates:
            columns[f"step[{b}]"] = [i.whole_step(b) for i in inputs]
            columns[f"per_layer[{b}]"] = forward_launches(inputs, b)
            if plain_step:
                columns[f"step_plain[{b}]"] = [i.plain_step(b) for i in inputs]
        columns["index_build"] = [i.index_build() for i in inputs]
        columns["mask_convert"] = [i.mask_convert() for i in inputs]
        columns["prepare_fused"] = [i.prepare() for i in inputs]
    timings = time_graphs(columns)
    if step_candidates and with_prep:
        best = min(step_candidates, key=lambda b: timings[b])
        for b in step_candidates:
            if b != best:
                del timings[f"step[{b}]"], timings[f"per_layer[{b}]"]
                timings.pop(f"step_plain[{b}]", None)
    if floor * 1e6 < REFERENCE_MAX_FLOOR_US:
        timings["reference(eager)"] = time_eager(inputs[0].attention("reference"))
    for name, seconds in timings.items():
        row["time_us"][name] = seconds * 1e6
    row["sol_fraction"] = {k: floor / v for k, v in timings.items() if not k.startswith(PREP_OP_PREFIXES)}
    if "flashmla" in timings:  # time over FlashMLA's: < 1 is faster than FlashMLA
        row["vs_flashmla"] = {k: v / timings["flashmla"] for k, v in timings.items()
                              if k != "flashmla" and not k.startswith(PREP_OP_PREFIXES)}
    if "sglang_baseline" in timings:
        row["speedup_vs_baseline"] = {k: timings["sglang_baseline"] / v for k, v in timings.items()
                                      if k != "sglang_baseline" and not k.startswith(PREP_PREFIXES)}
    del inputs
    torch.cuda.empty_cache()
    return row


def git_commit() -> str:
    if os.environ.get("DDTREE_COMMIT"):  # the device's copy of the tree has no .git
        return os.environ["DDTREE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all", choices=["all", "grid", "ragged", "ragged_pairs", "serving"])
    parser.add_argument("--backends", default="triton,sglang_baseline", help="comma list: sm90,triton,sglang_baseline,flashmla (FlashMLA's dense decode, where flash_mla imports), "
                        "paged:BACKEND (the attention alone over 64-row pages), paged_step:BACKEND (the whole paged step), "
                        "sglang_extend (SGLang's own Triton extend kernel, where sglang imports)")
    parser.add_argument("--triton-configs", default=None, help="extra Triton variants 'BM,BN,warps,stages;...'")
    parser.add_argument("--filter", default=None, help="only cases whose name contains this (a comma list: any of these; "
                        "a name ending in $: that name exactly)")
    parser.add_argument("--no-prep", action="store_true", help="skip timing index build, mask conversion, whole step")
    parser.add_argument("--plain-step", action="store_true", help="also time each whole step with its kernels launched "
                        "one after another (DDTREE_PDL=0), as step_plain[BACKEND]")
    parser.add_argument("--out", default=None, help="output directory (default bench/results/<date>_<gpu>_<commit>)")
    args = parser.parse_args(argv)

    cases = {"all": all_cases, "grid": grid_cases, "ragged": ragged_cases, "ragged_pairs": ragged_pair_cases,
             "serving": serving_cases}[args.cases]()
    if args.filter:
        wanted = args.filter.split(",")
        cases = [c for c in cases if any(c.name == w[:-1] if w.endswith("$") else w in c.name for w in wanted)]
    backends = [b for b in args.backends.split(",") if b]
    if "flashmla" in backends and not flashmla_available():
        backends.remove("flashmla")
    if "sglang_extend" in backends:
        from bench.sglang_triton_extend import available

        ok, why = available()
        if not ok:
            print(f"sglang_extend column skipped: SGLang's extend kernel does not import here ({why})")
            backends.remove("sglang_extend")
    triton_configs = parse_triton_configs(args.triton_configs)
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = git_commit()
    out_dir = Path(args.out or f"bench/results/{date}_{gpu.replace(' ', '-')}_{commit}")
    out_dir.mkdir(parents=True, exist_ok=True)

    ceilings = measure_ceilings()
    print(f"{gpu}, torch {torch.__version__}, commit {commit}: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 mm {ceilings['bf16_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    meta = {"date": date, "gpu": gpu, "commit": commit, "torch": torch.__version__, "ceilings": ceilings}
    rows = []
    for case in cases:
        rows.append(bench_case(case, backends, triton_configs, ceilings, not args.no_prep, args.plain_step))
        r = rows[-1]
        print(f"  {case.name}: " + ", ".join(f"{k} {v:.1f}us" for k, v in r["time_us"].items()), flush=True)
        # Written after every shape, so a run cut short still leaves its measurements.
        (out_dir / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_report(out_dir, {"meta": meta, "rows": rows})
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
