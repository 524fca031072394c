// The persistent schedule of the sm_90a verify kernel, computed by every CTA from the indptrs.
// ddtree_op/backends/sm90/persistent_schedule.py is its reference in Python and says what it
// does; the Triton combine (persistent_combine.py beside it) finds the partial slots with the
// same formulas.
#pragma once

#include "../contract.cuh"
#include "../index_view.cuh"

namespace ddtree::sm90 {


struct RequestWork {
  int row_blocks;  // ceil(drafts * heads / 64)
  int units;       // ceil(keys / 128)
};

struct PlanInputs {
  IndexView qo_indptr;
  const int32_t* verify_indptr;
  int heads, rows_per_block, batch, ctas, splits;

  __device__ __forceinline__ RequestWork work(int request) const {
    const int rows = static_cast<int>(qo_indptr[request + 1] - qo_indptr[request]) * heads;
    const int keys = verify_indptr[request + 1] - verify_indptr[request];
    return {(rows + rows_per_block - 1) / rows_per_block, (keys + kUnitKeys - 1) / kUnitKeys};
  }
};

// What every CTA decides from one scan of the batch.
struct BatchPlan {
  bool equal_shares;
  int row_blocks;  // of all requests
  int64_t total;   // items: (row block, unit) pairs
  int64_t used;    // CTAs with an equal share: min(ctas, total)
};

__device__ __forceinline__ BatchPlan plan_batch(const PlanInputs& in) {
  BatchPlan plan{false, 0, 0, 0};
  int longest_piece = 0;
  for (int b = 0; b < in.batch; ++b) {
    const RequestWork w = in.work(b);
    plan.row_blocks += w.row_blocks;
    plan.total += int64_t(w.row_blocks) * w.units;
    if (w.row_blocks > 0) longest_piece = max(longest_piece, (w.units + in.splits - 1) / in.splits);
  }
  if (plan.total == 0) return plan;
  plan.used = min(int64_t(in.ctas), plan.total);
  const int64_t share = (plan.total + plan.used - 1) / plan.used;
  const int64_t waves = (int64_t(plan.row_blocks) * in.splits + in.ctas - 1) / in.ctas;
  // Pieces write slot = piece with more than one split: they must fit the 2 slots per CTA.
  const bool pieces_fit = in.splits == 1 || int64_t(plan.row_blocks) * in.splits <= 2 * int64_t(in.ctas);
  plan.equal_shares = !pieces_fit || share + kCutCostUnits < waves * longest_piece;
  return plan;
}

struct Segment {
  int request, block;          // row block `block` of `request`
  int unit_begin, unit_end;    // its units [unit_begin, unit_end); empty for an empty split
  int units;                   // of the whole row block
  int slot;                    // partial slot, or -1: out/lse directly
};

// Row block number `index` (over all requests, in order) as (request, block); false past the end.
__device__ __forceinline__ bool locate_row_block(const PlanInputs& in, int index, int& request, int& block, RequestWork& w) {
  for (int b = 0; b < in.batch; ++b) {
    w = in.work(b);
    if (index < w.row_blocks) {
      request = b;
      block = index;
      return true;
    }
    index -= w.row_blocks;
  }
  return false;
}

// Segment k, in processing order, of CTA `cta`; false when it has no more.
__device__ __forceinline__ bool plan_segment(const PlanInputs& in, const BatchPlan& plan, int cta, int k, Segment& seg) {
  if (!plan.equal_shares) {  // pieces: CTA c takes pieces c, c + ctas, ...
    const int piece = cta + k * in.ctas;
    RequestWork w;
    if (piece >= plan.row_blocks * in.splits || !locate_row_block(in, piece / in.splits, seg.request, seg.block, w)) {
      return false;
    }
    const int chunk = (w.units + in.splits - 1) / in.splits;
    seg.unit_begin = min(w.units, (piece % in.splits) * chunk);
    seg.unit_end = min(w.units, seg.unit_begin + chunk);
    seg.units = w.units;
    seg.slot = in.splits > 1 ? piece : -1;
    return true;
  }
  if (cta >= plan.used) return false;
  const int64_t begin = cta * plan.total / plan.used, end = (cta + 1) * plan.total / plan.used;
  // The row block that holds `begin`: request b, block j, first item `start`.
  int b = 0, j = 0;
  int64_t start = 0;
  RequestWork w{0, 0};
  for (; b < in.batch; ++b) {
    w = in.work(b);
    const int64_t items = int64_t(w.row_blocks) * w.units;
    if (begin < start + items) {
      j = static_cast<int>((begin - start) / w.units);
      start += int64_t(j) * w.units;
      break;
    }
    start += items;
  }
  // A first segment cut at its start goes last, so that the CTAs begin their whole row blocks
  // (and sweep their requests' keys) in step, which keeps the keys they share in L2: segments
  // 1, 2, ..., n - 1, then 0.
  const bool defer_first = begin > start && start + w.units < end;
  auto walk = [&](int steps) -> bool {  // to the row block `steps` after the current one
    for (int s = 0; s < steps; ++s) {
      start += w.units;
      if (start >= end) return false;
      if (++j == w.row_blocks) {
        do {
          w = in.work(++b);
        } while (w.row_blocks == 0);  // a request with items follows, since start < end <= total
        j = 0;
      }
    }
    return true;
  };
  if (defer_first) {
    const int64_t first_start = start;
    const RequestWork first_work = w;
    const int first_b = b, first_j = j;
    if (!walk(k + 1)) {
      // Past the last segment: segment 0 comes now if segment k was the last, i.e. exists.
      if (k == 0) return false;  // unreachable: defer_first means segment 1 exists
      start = first_start, w = first_work, b = first_b, j = first_j;
      if (!walk(k)) return false;
      start = first_start, w = first_work, b = first_b, j = first_j;
    }
  } else if (!walk(k)) {
    return false;
  }
  const int64_t lo = max(begin, start), hi = min(end, start + w.units);
  seg.request = b;
  seg.block = j;
  seg.unit_begin = static_cast<int>(lo - start);
  seg.unit_end = static_cast<int>(hi - start);
  seg.units = w.units;
  seg.slot = lo == start && hi == start + w.units ? -1 : 2 * cta + (lo == begin ? 0 : 1);
  return true;
}

}  // namespace ddtree::sm90
