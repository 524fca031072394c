"""Whether compute-sanitizer's racecheck orders a shared-memory write before `bar.arrive` against a
read after `bar.sync` on the same named barrier (the sm90 kernel's seesaw hands its row maxima and
rescale factors between the GEMM warpgroups that way, and racecheck reports the `st.scale1` pair):

  python3 -m bench.racecheck_probe      (on the GPU machine; builds one small program with nvcc)

Two groups of 128 threads in one CTA, like the kernel's two GEMM warpgroups. The writers store a
word per thread and signal; the readers wait and load them. Each mode runs racecheck once:
  arrive_first  writers store, `bar.arrive`; readers spin first, then `bar.sync` and load
  sync_first    readers `bar.sync` at once; writers spin first, then store and `bar.arrive`
  both_sync     as arrive_first, but the writers `bar.sync` too (the barrier at its plainest)
  mbarrier      writers store and arrive on an mbarrier; readers spin, then wait on it and load
A mode whose program prints a wrong sum has a real race; racecheck should report nothing in all four.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>

enum Mode { kArriveFirst, kSyncFirst, kBothSync, kMbarrier };

__device__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
}

__global__ void probe(int mode, int rounds, unsigned* out) {
  __shared__ float words[128];
  __shared__ alignas(8) unsigned long long mbar;
  const int tid = threadIdx.x, lane_id = tid % 128;
  const bool writer = tid < 128;
  const unsigned mbar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&mbar));
  if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"(mbar_addr));
  __syncthreads();
  unsigned sum = 0;
  for (int r = 0; r < rounds; ++r) {
    if (writer) {
      if (mode == kSyncFirst) spin(20000);
      words[lane_id] = float(r * 128 + lane_id);
      if (mode == kMbarrier) {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mbar_addr) : "memory");
      } else if (mode == kBothSync) {
        asm volatile("bar.sync 1, 256;" ::: "memory");
      } else {
        asm volatile("bar.arrive 1, 256;" ::: "memory");
      }
      asm volatile("bar.sync 2, 256;" ::: "memory");  // the readers are done before the next round's store
    } else {
      if (mode != kSyncFirst) spin(20000);
      if (mode == kMbarrier) {
        unsigned done = 0;
        while (!done) {
          asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                       : "=r"(done) : "r"(mbar_addr), "r"(r & 1) : "memory");
        }
      } else {
        asm volatile("bar.sync 1, 256;" ::: "memory");
      }
      sum += static_cast<unsigned>(words[127 - lane_id]) == unsigned(r * 128 + 127 - lane_id);
      asm volatile("bar.arrive 2, 256;" ::: "memory");
    }
  }
  if (!writer) atomicAdd(out, sum);
}

int main(int argc, char** argv) {
  const char* names[] = {"arrive_first", "sync_first", "both_sync", "mbarrier"};
  int mode = -1;
  for (int m = 0; m < 4; ++m) if (argc > 1 && !strcmp(argv[1], names[m])) mode = m;
  if (mode < 0) { fprintf(stderr, "usage: probe arrive_first|sync_first|both_sync|mbarrier\n"); return 2; }
  const int rounds = 4;
  unsigned* out;
  cudaMalloc(&out, sizeof(unsigned));
  cudaMemset(out, 0, sizeof(unsigned));
  probe<<<1, 256>>>(mode, rounds, out);
  unsigned sum = 0;
  cudaMemcpy(&sum, out, sizeof(unsigned), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  printf("%s: %u of %d loads saw the round's value (%s)\n", names[mode], sum, 128 * rounds, cudaGetErrorString(err));
  return sum == unsigned(128 * rounds) && err == cudaSuccess ? 0 : 1;
}
"""

MODES = ("arrive_first", "sync_first", "both_sync", "mbarrier")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cu", Path(tmp) / "probe"
        src.write_text(SOURCE)
        subprocess.run(["nvcc", "-O3", "-lineinfo", "-arch=sm_90a", str(src), "-o", str(exe)], check=True)
        for mode in MODES:
            plain = subprocess.run([str(exe), mode], capture_output=True, text=True)
            checked = subprocess.run(["compute-sanitizer", "--tool", "racecheck", "--racecheck-report", "all", str(exe), mode],
                                     capture_output=True, text=True)
            report = [line for line in checked.stdout.splitlines() if "Race reported" in line or "hazard" in line.lower()
                      or "SUMMARY" in line]
            print(f"== {mode}: {plain.stdout.strip()} (rc {plain.returncode})")
            print("\n".join(report[:6]) or "(racecheck printed no hazard line)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
