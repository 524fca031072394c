"""Whether a failed TORCH_CHECK raises or kills the process, by how its message is built and by
which compiler built it (a diagnostic for the CUDA preparation op's status check, which crashed
the process on the H200 while the op's other checks raised):

  PYTHONPATH=$PWD python3 -m bench.check_message_probe      (on the GPU machine; ~40 s to build)

Builds one small library from an nvcc and a g++ translation unit with the package's nvcc flags,
then calls each probe op in a process of its own and prints whether it raised or crashed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

NVCC_SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>
#include <string>
namespace {
at::Tensor strings_only(const at::Tensor& x) { TORCH_CHECK(x.numel() < 0, "nvcc: strings ", "only"); return x; }
at::Tensor streamed_int(const at::Tensor& x) { const int64_t n = x.numel(); TORCH_CHECK(n < 0, "nvcc: streamed ", n); return x; }
at::Tensor to_string_int(const at::Tensor& x) {
  TORCH_CHECK(x.numel() < 0, std::string("nvcc: to_string ") + std::to_string(x.numel()));
  return x;
}
}  // namespace
TORCH_LIBRARY(ddtree_probe_nvcc, m) {
  m.def("strings_only(Tensor x) -> Tensor", &strings_only);
  m.def("streamed_int(Tensor x) -> Tensor", &streamed_int);
  m.def("to_string_int(Tensor x) -> Tensor", &to_string_int);
}
"""

GXX_SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>
namespace {
at::Tensor streamed_int(const at::Tensor& x) { const int64_t n = x.numel(); TORCH_CHECK(n < 0, "g++: streamed ", n); return x; }
}  // namespace
TORCH_LIBRARY(ddtree_probe_gxx, m) { m.def("streamed_int(Tensor x) -> Tensor", &streamed_int); }
"""

CALL = """
import sys, torch
torch.ops.load_library(sys.argv[1])
namespace, name = sys.argv[2].split(".")
try:
    getattr(getattr(torch.ops, namespace), name)(torch.zeros(3))
    print("returned")
except RuntimeError as error:
    print("raised:", str(error).splitlines()[0])
"""

PROBES = ["ddtree_probe_nvcc.strings_only", "ddtree_probe_nvcc.to_string_int", "ddtree_probe_nvcc.streamed_int",
          "ddtree_probe_gxx.streamed_int"]


def main() -> int:
    from torch.utils.cpp_extension import load

    from ddtree_op.build import cuda_build_flags

    work = Path(tempfile.mkdtemp(prefix="ddtree_probe_"))
    (work / "probe_nvcc.cu").write_text(NVCC_SOURCE)
    (work / "probe_gxx.cpp").write_text(GXX_SOURCE)
    start = time.perf_counter()
    flags = cuda_build_flags()
    library = load(name="ddtree_check_probe", sources=[str(work / "probe_nvcc.cu"), str(work / "probe_gxx.cpp")],
                   extra_cflags=flags["cxx"], extra_cuda_cflags=flags["nvcc"], build_directory=str(work),
                   is_python_module=False)
    print(f"built in {time.perf_counter() - start:.0f} s", flush=True)
    for probe in PROBES:
        result = subprocess.run([sys.executable, "-c", CALL, library, probe], capture_output=True, text=True, timeout=120)
        lines = (result.stdout + result.stderr).strip().splitlines()
        outcome = "crashed" if result.returncode < 0 else (lines[-1] if lines else "no output")
        print(f"{probe:36} exit {result.returncode:4}  {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
