// The schedule plan's phases timed, for a debug build (nvcc -DDDTREE_PLAN_CLOCKS, e.g.
// DDTREE_NVCC_EXTRA=-DDDTREE_PLAN_CLOCKS python -m bench.profile_case CASE --step --kernels): thread 0
// of plan block 0 stamps the SM clock as each phase ends and prints the cycles of each when the plan
// is written, one line a launch (`plan_clocks ...`). Without the macro every call here compiles to
// nothing.
#pragma once

#include <cstdio>

namespace ddtree {

enum PlanPhase : int {
  kPlanStart,        // the launch's block started (before the batch is sanitized)
  kPlanSanitized,    // the batch staged and checked (verify_status.cuh)
  kPlanTotals,       // batch_totals: the batch's work, rows, longest request
  kPlanChoice,       // plan_choice: equal shares or pieces
  kPlanPieceSearch,  // split_piece_units: the pieces' length
  kPlanScan,         // the scan over the batch's chunks (row block and piece entries)
  kPlanWritten,      // the padding entries and the header
  kPlanPhases,
};

#ifdef DDTREE_PLAN_CLOCKS
// The stamps, in shared memory (in registers, held across the plan, they spilled).
__device__ __forceinline__ long long* plan_stamps() {
  __shared__ long long stamps[kPlanPhases];
  return stamps;
}
#endif

struct PlanClock {
#ifdef DDTREE_PLAN_CLOCKS
  long long start;
  bool on = false;
  __device__ PlanClock() { start = clock64(); }
  // From here on, this thread records (thread 0 of plan block 0).
  __device__ __forceinline__ void record_if(bool first_thread) {
    on = first_thread;
    if (on) plan_stamps()[kPlanStart] = start;
  }
  __device__ __forceinline__ void mark(PlanPhase phase) const {
    if (on) plan_stamps()[phase] = clock64();
  }
  __device__ __forceinline__ void print(int batch) const {
    if (!on) return;
    const long long* const t = plan_stamps();
    printf("plan_clocks B=%d cycles: sanitize %lld, totals %lld, choice %lld, piece search %lld, scan %lld, "
           "writes %lld, all %lld\n",
           batch, t[kPlanSanitized] - t[kPlanStart], t[kPlanTotals] - t[kPlanSanitized], t[kPlanChoice] - t[kPlanTotals],
           t[kPlanPieceSearch] - t[kPlanChoice], t[kPlanScan] - t[kPlanPieceSearch], t[kPlanWritten] - t[kPlanScan],
           t[kPlanWritten] - t[kPlanStart]);
  }
#else
  __device__ __forceinline__ void record_if(bool) {}
  __device__ __forceinline__ void mark(PlanPhase) const {}
  __device__ __forceinline__ void print(int) const {}
#endif
};

}  // namespace ddtree
