// Where the warpgroups of a CTA wait, for a debug build (nvcc -DDDTREE_WAIT_CLOCKS, e.g.
// DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS python -m bench.profile_case CASE --iters 1): each role's
// first thread sums the cycles it spends in each kind of wait, in shared memory, and CTA (0, 0)
// prints the sums when it is done. Without the macro every call here compiles to nothing.
#pragma once

#include <cstdio>

namespace ddtree::sm90 {

enum WaitSlot : int {
  kLoadWait,      // GEMM warpgroups: chunk_full (a part of a tile still landing); gather: chunk_empty
  kSGemmWait,     // S = Q K^T issued, waiting for it to retire
  kPartnerWait,   // named barriers: the other GEMM warpgroup's scale or P
  kPvGemmWait,    // P V issued, waiting for it to retire
  kPairCycles,    // the whole pair loop
  kPairs,
  kPrologue,      // GEMM warpgroups: a segment's start (after its barrier) to its pair loop: q copies and their wait
  kEpilogue,      // GEMM warpgroups: the pair loop's end to the segment's output stored (and merged)
  kWaitSlots = 8,
};
constexpr int kWaitRoles = 3;  // GEMM warpgroups 0 and 1, the gather (the last)

struct WaitClock {
#ifdef DDTREE_WAIT_CLOCKS
  unsigned long long* slots;  // this role's sums in shared memory; nullptr: not the role's first thread
  __device__ __forceinline__ long long now() const { return clock64(); }
  __device__ __forceinline__ void add(int slot, long long since) const {
    if (slots) slots[slot] += static_cast<unsigned long long>(clock64() - since);
  }
  __device__ __forceinline__ void count(int slot) const {
    if (slots) slots[slot] += 1;
  }
  __device__ __forceinline__ void print(int role) const {
    if (slots && blockIdx.x == 0 && blockIdx.y == 0) {
      if (role == kWaitRoles - 1) {
        printf("wait_clocks cta0 gather: pairs %llu, pair loop %llu cycles; waiting for parts to be released %llu\n",
               slots[kPairs], slots[kPairCycles], slots[kLoadWait]);
      } else {
        printf("wait_clocks cta0 GEMM warpgroup %d: pairs %llu, pair loop %llu cycles; load %llu, S gemm %llu, partner %llu, "
               "PV gemm %llu; segments' prologues %llu, epilogues %llu\n",
               role, slots[kPairs], slots[kPairCycles], slots[kLoadWait], slots[kSGemmWait], slots[kPartnerWait],
               slots[kPvGemmWait], slots[kPrologue], slots[kEpilogue]);
      }
    }
  }
#else
  __device__ __forceinline__ long long now() const { return 0; }
  __device__ __forceinline__ void add(int, long long) const {}
  __device__ __forceinline__ void count(int) const {}
  __device__ __forceinline__ void print(int) const {}
#endif
};

// The clock of `role` for this thread (the role's first thread records).
template <class SharedState>
__device__ __forceinline__ WaitClock wait_clock(SharedState& st, int role, int wg_thread) {
#ifdef DDTREE_WAIT_CLOCKS
  return WaitClock{wg_thread == 0 ? st.wait_clocks[role] : nullptr};
#else
  (void)st, (void)role, (void)wg_thread;
  return WaitClock{};
#endif
}

}  // namespace ddtree::sm90
