// Where the warpgroups of a CTA wait, for a debug build (nvcc -DDDTREE_WAIT_CLOCKS, e.g.
// DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS python -m bench.profile_case CASE --iters 1): each role's
// first thread sums the cycles it spends in each kind of wait, in shared memory, and records when
// the events of one pair happen (the timeline of pair kTracedPair: the GEMM warpgroups' pair and
// the gather's loads for the pair after it, which wait for that pair's releases); CTA (0, 0)
// stores both when it is done, and a one-thread launch after the kernel prints them. Without the
// macro every call here compiles to nothing.
#pragma once

#include <cuda_runtime.h>

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
  // The prologue's and the epilogue's parts (GEMM warpgroups):
  kQWait,            // the q tile's copies, waited for (in kPrologue)
  kEpilogueSums,     // the row sums exchanged with the other warpgroup (waiting for its pair loop to end)
  kEpilogueStaging,  // the output tile into shared memory and the barrier after it
  kEpilogueStores,   // the tile's rows from shared memory to global
  kEpilogueMerge,    // the persistent kernel's count of its partial and, in the CTA that wrote the last, the merge
  kWaitSlots = 13,
};
constexpr int kWaitRoles = 3;  // GEMM warpgroups 0 and 1, the gather (the last)

// The events of the traced pair, in each role's order (WaitClock::print names them).
enum TraceEvent : int {
  kTracePairStart,
  // GEMM warpgroups: S's two chunk groups landed, S retired, this warpgroup's scale published or
  // (warpgroup 1) awaited, P stored, the first P V issued, the partner's hand-off awaited, the
  // second P V issued, the first and the second release.
  kTraceFirstGroup, kTraceSecondGroup, kTraceSDone, kTraceScale, kTracePStored, kTraceFirstPv,
  kTracePartner, kTraceSecondPv, kTraceFirstRelease, kTraceSecondRelease,
  // Gather (the pair after the traced one): each release group acquired and its copies issued,
  // in the gather's order.
  kTraceGroup0Acquired = 1, kTraceGroup0Issued, kTraceGroup1Acquired, kTraceGroup1Issued, kTraceGroup2Acquired,
  kTraceGroup2Issued, kTraceGroup3Acquired, kTraceGroup3Issued,
  kTraceEvents = 11,
};
constexpr int kTracedPair = 16;  // of the CTA's pairs (all its segments): well past the first refills

#ifdef DDTREE_WAIT_CLOCKS
// CTA (0, 0)'s sums and traced pair by role (WaitClock::store), printed by a launch after the
// kernel: a printf in the kernel would make ptxas serialise its wgmma (C7510). Static, as the
// printer and its launch: each kernel source has its own (one library links several).
static __device__ unsigned wait_clock_dump[kWaitRoles][kWaitSlots + kTraceEvents];

static __global__ void print_wait_clocks() {
  for (int role = 0; role < kWaitRoles; ++role) {
    const unsigned* const slots = wait_clock_dump[role];
    int t[kTraceEvents];
    for (int e = 0; e < kTraceEvents; ++e) t[e] = static_cast<int>(slots[kWaitSlots + e]);
    if (role == kWaitRoles - 1) {
      printf("wait_clocks cta0 gather: pairs %u, pair loop %u cycles; waiting for parts to be released %u\n",
             slots[kPairs], slots[kPairCycles], slots[kLoadWait]);
      printf("trace cta0 gather, loads of pair %d: start %d; stage 0 chunks 0-3 released %d issued %d; stage 1 chunks 4-8 "
             "released %d issued %d; stage 0 chunks 4-8 released %d issued %d; stage 1 chunks 0-3 released %d issued %d\n",
             kTracedPair + 1, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
    } else {
      printf("wait_clocks cta0 GEMM warpgroup %d: pairs %u, pair loop %u cycles; load %u, S gemm %u, partner %u, "
             "PV gemm %u; segments' prologues %u (q wait %u), epilogues %u (sums %u, staging %u, stores %u, "
             "merge %u)\n",
             role, slots[kPairs], slots[kPairCycles], slots[kLoadWait], slots[kSGemmWait], slots[kPartnerWait],
             slots[kPvGemmWait], slots[kPrologue], slots[kQWait], slots[kEpilogue], slots[kEpilogueSums],
             slots[kEpilogueStaging], slots[kEpilogueStores], slots[kEpilogueMerge]);
      printf("trace cta0 GEMM warpgroup %d, pair %d: start %d; S groups landed %d %d, retired %d; scale %d; P stored %d; "
             "first P V issued %d; partner %d; second P V issued %d; releases %d %d\n",
             role, kTracedPair, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10]);
    }
  }
}
#endif

// After the kernel, on its stream: CTA (0, 0)'s waits printed (the debug build only).
static inline void print_wait_clocks_after(cudaStream_t stream) {
#ifdef DDTREE_WAIT_CLOCKS
  print_wait_clocks<<<1, 1, 0, stream>>>();
#else
  (void)stream;
#endif
}

struct WaitClock {
#ifdef DDTREE_WAIT_CLOCKS
  unsigned* slots;  // this role's sums in shared memory (32 bits hold one launch's cycles); nullptr: not
                    // the role's first thread
  unsigned* trace;            // this role's events of the traced pair (nullptr: not recording them)
  const unsigned* origin;     // warpgroup 0's start of the traced pair: the timeline's 0
  __device__ __forceinline__ long long now() const { return clock64(); }
  __device__ __forceinline__ void add(int slot, long long since) const {
    if (slots) slots[slot] += static_cast<unsigned>(clock64() - since);
  }
  __device__ __forceinline__ void count(int slot) const {
    if (slots) slots[slot] += 1;
  }
  // The same clock, recording events only in the traced pair (the gather: the pair after it).
  __device__ __forceinline__ WaitClock at_pair(int pair, bool gather) const {
    WaitClock c = *this;
    if (pair != kTracedPair + (gather ? 1 : 0)) c.trace = nullptr;
    return c;
  }
  __device__ __forceinline__ void mark(int event) const {
    if (slots && trace) trace[event] = static_cast<unsigned>(clock64());
  }
  // CTA (0, 0)'s sums and timeline of `role`, copied to device memory for print_wait_clocks.
  __device__ __forceinline__ void store(int role) const {
    if (slots && blockIdx.x == 0 && blockIdx.y == 0) {
      unsigned* const dump = wait_clock_dump[role];
      for (int k = 0; k < kWaitSlots; ++k) dump[k] = slots[k];
      // Cycles after warpgroup 0's start of the traced pair; events not reached: 0 - origin.
      for (int e = 0; e < kTraceEvents; ++e) dump[kWaitSlots + e] = trace[e] - *origin;
    }
  }
#else
  __device__ __forceinline__ long long now() const { return 0; }
  __device__ __forceinline__ void add(int, long long) const {}
  __device__ __forceinline__ void count(int) const {}
  __device__ __forceinline__ WaitClock at_pair(int, bool) const { return *this; }
  __device__ __forceinline__ void mark(int) const {}
  __device__ __forceinline__ void store(int) const {}
#endif
};

// The clock of `role` for this thread (the role's first thread records).
template <class SharedState>
__device__ __forceinline__ WaitClock wait_clock(SharedState& st, int role, int wg_thread) {
#ifdef DDTREE_WAIT_CLOCKS
  return WaitClock{wg_thread == 0 ? st.wait_clocks[role] : nullptr, st.trace[role], &st.trace[0][kTracePairStart]};
#else
  (void)st, (void)role, (void)wg_thread;
  return WaitClock{};
#endif
}

}  // namespace ddtree::sm90
