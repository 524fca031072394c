"""ptxas's report of every CUDA source of the tree, compiled for sm_90a with the package's own flags on
any machine with nvcc (no GPU needed): each kernel's registers and spills, and the notes in which
ptxas says it serialised a kernel's wgmma instructions ("Potential Performance Loss", C7510-C7519).
ptxas prints those notes as info lines, so a check for errors, warnings and spills misses them, and
a serialised kernel runs ~1.2-1.4x slower (kernel log, twenty-first session).

    python -m bench.ptxas_report [--library sm90|prep|all] [--only SUBSTRING] [--define NAME=VALUE]...
                                 [--jobs N] [--out FILE]

Run it from the root of the tree to check (a checkout or a `.snap/` tree): the sources are those of
the `ddtree_op` that Python imports. Exits 1 if a kernel spills or has its wgmma serialised.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ARCH = "90a"
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SERIALISED = re.compile(r"\((C75\d\d)\) Potential Performance Loss: (.*?) (?:in|for) the function '([^']+)'")


@dataclass
class KernelReport:
    name: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    serialised: list[str] = field(default_factory=list)  # "C7511: <ptxas's reason>"

    @property
    def clean(self) -> bool:
        return self.spill_stores == 0 and self.spill_loads == 0 and not self.serialised


def parse_ptxas(text: str) -> list[KernelReport]:
    """The kernels of one `nvcc -Xptxas -v` output, in the order ptxas compiled them."""
    kernels: dict[str, KernelReport] = {}
    current = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = kernels.setdefault(m.group(1), KernelReport(m.group(1)))
        elif (m := _SPILLS.search(line)) and current is not None:
            current.spill_stores, current.spill_loads = int(m.group(2)), int(m.group(3))
        elif (m := _REGISTERS.search(line)) and current is not None:
            current.registers = int(m.group(1))
        if m := _SERIALISED.search(line):
            kernels.setdefault(m.group(3), KernelReport(m.group(3))).serialised.append(f"{m.group(1)}: {m.group(2)}")
    return list(kernels.values())


def _torch_include_dirs(stub_dir: Path) -> list[str]:
    import torch.utils.cpp_extension as ext

    include = ext.include_paths()
    # A CPU build of torch lacks the CUDA build's generated macros header, which c10/cuda includes;
    # ptxas's report does not depend on what it defines.
    if not any((Path(d) / "c10/cuda/impl/cuda_cmake_macros.h").is_file() for d in include):
        header = stub_dir / "c10/cuda/impl/cuda_cmake_macros.h"
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text("#pragma once\n")
        include = [*include, str(stub_dir)]
    return include


def compile_jobs(library: str, only: str | None, stub_dir: Path) -> list[tuple[Path, list[str], list[str]]]:
    """(source, extra flags, include dirs) of each .cu source to compile."""
    from ddtree_op.build import cuda_sources, include_dirs

    include_torch = _torch_include_dirs(stub_dir)
    libraries = ["prep", "sm90"] if library == "all" else [library]
    jobs = [(source, [], include_dirs(name) + include_torch) for name in libraries for source in cuda_sources(name)
            if source.suffix == ".cu"]
    return [job for job in jobs if only is None or only in job[0].name]


def compile_report(source: Path, flags: list[str], include: list[str], out_dir: Path) -> str:
    command = ["nvcc", "-std=c++20", *flags, *(f"-I{d}" for d in include), "-Xptxas", "-v", "-c", str(source),
               "-o", str(out_dir / f"{source.name}.o")]
    done = subprocess.run(command, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source} (rc {done.returncode}):\n{text[-4000:]}")
    return text


def main(argv: list[str] | None = None) -> int:
    from ddtree_op.build import cuda_build_flags, kernel_source_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default="sm90", choices=["sm90", "prep", "all"])
    parser.add_argument("--only", default=None, help="only sources whose name contains this")
    parser.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                        help="a macro for every source (a variant's switch, say)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=None, help="write ptxas's whole output here")
    parser.add_argument("--objects", default=None, help="keep the objects in this folder (for cuobjdump -sass)")
    args = parser.parse_args(argv)

    flags = cuda_build_flags(ARCH)["nvcc"] + [f"-D{define}" for define in args.define]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = compile_jobs(args.library, args.only, Path(tmp) / "stub")
        out_dir = Path(args.objects) if args.objects else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            texts = list(pool.map(lambda job: compile_report(job[0], flags + job[1], job[2], out_dir), jobs))

    root = kernel_source_dir()
    failed = 0
    log = []
    for (source, _, _), text in zip(jobs, texts):
        log.append(f"== {source.relative_to(root)}\n{text}")
        for kernel in parse_ptxas(text):
            failed += not kernel.clean
            notes = "; ".join(kernel.serialised) or "-"
            print(f"{'ok  ' if kernel.clean else 'FAIL'} {source.name}: {kernel.registers} registers, "
                  f"{kernel.spill_stores} B spill stores, {kernel.spill_loads} B spill loads, wgmma serialised: {notes} "
                  f"({kernel.name[:60]})")
    if args.out:
        Path(args.out).write_text("\n".join(log))
    print(f"{len(jobs)} sources, {failed} kernels with spills or serialised wgmma")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
