// Where the transposed e4m3 kernel's roles wait, for a debug build (nvcc -DDDTREE_WAIT_CLOCKS, as
// wait_clocks.cuh; e.g. DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS python -m bench.profile_case CASE --fp8
// --iters 1): each role's first thread sums, in shared memory, the cycles it spends in each wait;
// CTA 0's copy their sums to device memory when the piece is done, and a one-thread launch after
// the kernel prints them (a printf in the kernel would serialise its wgmma: C7510). Beside a forced
// split count (profile_case --splits) it tells whether tiles land later when every SM streams than
// when few do (every CTA's phases: cta_timeline.cuh). ptxas: the clock build spills nothing;
// without the macro every call here compiles to nothing (the kernel's SASS is unchanged).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace ddtree::sm90 {

// The GEMM warpgroups' wait kinds (their q staging timed as one), and the gather's.
enum TransposedWait : int {
  kTileLanding, kSRetire, kPartnerBarriers, kORetire, kQStaging,
  kStageRelease = 0, kQStagedWait = 1,
  kTransposedWaits = 5
};

#ifdef DDTREE_WAIT_CLOCKS
// CTA 0's sums, by role (GEMM warpgroups 0, 1, the gather): rows, count (pairs or tiles), cycles
// (a GEMM warpgroup's from before its q staging to its output stored), waits.
// Static, as the printer and its launch: the bf16 and fp16 sources each have their own.
static __device__ unsigned long long transposed_clock_sums[3][3 + kTransposedWaits];

static __global__ void print_transposed_clocks() {
  const auto& s = transposed_clock_sums;
  for (int w = 0; w < 2; ++w) {
    printf("wait_clocks cta0 transposed N=%llu GEMM warpgroup %d: pairs %llu, %llu cycles; tile landing %llu, "
           "S retire %llu, partner barriers %llu, O retire %llu; q staging %llu\n",
           s[w][0], w, s[w][1], s[w][2], s[w][3 + kTileLanding], s[w][3 + kSRetire], s[w][3 + kPartnerBarriers],
           s[w][3 + kORetire], s[w][3 + kQStaging]);
  }
  printf("wait_clocks cta0 transposed N=%llu gather: tiles %llu, %llu cycles; stage release %llu, q staged %llu\n",
         s[2][0], s[2][1], s[2][2], s[2][3 + kStageRelease], s[2][3 + kQStagedWait]);
}
#endif

// A role's clock: its first thread adds its waits into the role's sums in shared memory (in
// registers, held across the pair loop, they spilled).
struct TransposedClock {
#ifdef DDTREE_WAIT_CLOCKS
  // The role's [count, start, waits...] as a shared-memory address (32 bits: the gather has 40-56
  // registers); kNone: not the role's first thread.
  static constexpr uint32_t kNone = ~0u;
  uint32_t sums;
  __device__ TransposedClock(unsigned (&role_sums)[2 + kTransposedWaits], bool first_thread)
      : sums(first_thread ? static_cast<uint32_t>(__cvta_generic_to_shared(role_sums)) : kNone) {
    if (sums == kNone) return;
    for (int k = 0; k < 2 + kTransposedWaits; ++k) role_sums[k] = 0;
    role_sums[1] = static_cast<unsigned>(clock());
  }
  // 32-bit stamps: a piece's cycles fit, and differences survive the wrap.
  __device__ __forceinline__ unsigned now() const { return static_cast<unsigned>(clock()); }
  __device__ __forceinline__ void add_at(int entry, unsigned amount) const {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(sums + 4 * entry));
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(sums + 4 * entry), "r"(v + amount));
  }
  __device__ __forceinline__ void add(int kind, unsigned since) const {
    if (sums != kNone) add_at(2 + kind, static_cast<unsigned>(clock()) - since);
  }
  __device__ __forceinline__ void tick() const {
    if (sums != kNone) add_at(0, 1);
  }
  // CTA 0's sums of `role` (0, 1: GEMM warpgroups; 2: the gather), for print_transposed_clocks.
  __device__ __forceinline__ void store(int role, int rows) const {
    if (sums == kNone || blockIdx.x != 0) return;
    const unsigned* const s_sums = static_cast<const unsigned*>(__cvta_shared_to_generic(sums));
    auto& s = transposed_clock_sums[role];
    s[0] = rows;
    s[1] = s_sums[0];
    s[2] = static_cast<unsigned>(clock()) - s_sums[1];
    for (int k = 0; k < kTransposedWaits; ++k) s[3 + k] = s_sums[2 + k];
  }
#else
  __device__ __forceinline__ unsigned now() const { return 0; }
  __device__ __forceinline__ void add(int, unsigned) const {}
  __device__ __forceinline__ void tick() const {}
  __device__ __forceinline__ void store(int, int) const {}
#endif
};

// The clock of `role` (0, 1: GEMM warpgroups; 2: the gather) for this thread (the role's first
// thread records), its sums in the kernel's shared state.
template <class State>
__device__ __forceinline__ TransposedClock transposed_clock(State& st, int role, bool first_thread) {
#ifdef DDTREE_WAIT_CLOCKS
  return TransposedClock(st.clock_sums[role], first_thread);
#else
  (void)st, (void)role, (void)first_thread;
  return TransposedClock{};
#endif
}

// After the kernel, on its stream: CTA 0's sums printed (the debug build only).
static inline void print_transposed_clocks_after(cudaStream_t stream) {
#ifdef DDTREE_WAIT_CLOCKS
  print_transposed_clocks<<<1, 1, 0, stream>>>();
#else
  (void)stream;
#endif
}

}  // namespace ddtree::sm90
