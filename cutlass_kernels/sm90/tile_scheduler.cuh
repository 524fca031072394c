// The tile schedule of the sm_90a verify kernels, read from the plan that the preparation made
// once for the batch (../verify_plan.cuh: its layout): a direct index for a split kernel's piece,
// one binary search per persistent CTA for the start of its equal share, no scan of the batch.
// ddtree_op/backends/sm90/schedule.py and persistent_schedule.py say in Python what the pieces
// and segments are; the Triton combines beside them find the partial slots in the same plan.
#pragma once

#include "../verify_plan.cuh"

namespace ddtree::sm90 {

struct Segment {
  int request, block;          // row block `block` of `request`
  int unit_begin, unit_end;    // its units [unit_begin, unit_end); empty for an empty split
  int slot;                    // partial slot, or -1: out/lse directly
  int pieces;                  // split kernel: pieces of the row block, whose partials are [slot, row]
  int row_block;               // persistent kernel: the plan's row block entry
};

// The split kernel's CTA `cta`: its piece, or false where it has none (past the plan's pieces, or
// a plan made for other heads or splits, from which nothing is read). The header and the piece
// entries are loaded together (one memory round trip): the grid never passes the piece arrays.
__device__ __forceinline__ bool plan_piece(const PlanView& plan, int heads, int splits, int cta, Segment& seg) {
  const int64_t pieces = plan.header(kPlanPieces), made_heads = plan.header(kPlanHeads), made_splits = plan.header(kPlanSplits);
  const int64_t row = plan.piece(kPieceRow, cta), units = plan.piece(kPieceUnits, cta), slot = plan.piece(kPieceSlot, cta);
  if (made_heads != heads || made_splits != splits || cta >= pieces) return false;
  seg.request = static_cast<int>(row >> 32);
  seg.block = static_cast<int>(row & 0xffffffff);
  seg.unit_begin = static_cast<int>(units >> 32);
  seg.unit_end = static_cast<int>(units & 0xffffffff);
  seg.slot = slot < 0 ? -1 : static_cast<int>(slot & 0xffffffff);
  seg.pieces = slot < 0 ? 1 : static_cast<int>(slot >> 32);
  return true;
}

// What a persistent CTA reads from the plan once: the choice and, with equal shares, its items
// [begin, end) and the row block `first` that holds `begin` (-1: no share, or a plan made for
// another schedule, in which case the CTA has no segment).
struct CtaPlan {
  PlanView plan;
  int ctas, splits;
  bool equal_shares;
  bool defer_first;  // the first segment is cut at its start and goes last
  int row_blocks, first;
  int64_t begin, end;
  int64_t items, used;  // all items, and the CTAs that share them
};

__device__ __forceinline__ CtaPlan read_cta_plan(const PlanView& plan, int heads, int ctas, int splits, int cta) {
  CtaPlan c{plan, ctas, splits, false, false, 0, -1, 0, 0, 0, 0};
  if (plan.header(kPlanHeads) != heads || plan.header(kPlanCtas) != ctas || plan.header(kPlanSplits) != splits) return c;
  c.row_blocks = static_cast<int>(plan.header(kPlanRowBlocks));
  c.equal_shares = plan.header(kPlanEqualShares) != 0;
  const int64_t used = plan.header(kPlanUsed), total = plan.header(kPlanItems);
  if (!c.equal_shares || cta >= used) return c;
  c.items = total;
  c.used = used;
  c.begin = cta * total / used;
  c.end = (cta + 1) * total / used;
  int lo = 0, hi = c.row_blocks;  // the last row block whose first item is <= begin
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (plan.field(kPlanFirstItem, mid) <= c.begin) lo = mid + 1; else hi = mid;
  }
  c.first = lo - 1;
  if (c.first < 0) return c;  // only a plan that contradicts itself: the CTA has no segment
  const int64_t start = plan.field(kPlanFirstItem, c.first);
  // A first segment cut at its start goes last, so that the CTAs begin their whole row blocks
  // (and sweep their requests' keys) in step, which keeps the keys they share in L2: segments
  // 1, 2, ..., n - 1, then 0.
  c.defer_first = c.begin > start && start + plan.field(kPlanUnits, c.first) < c.end;
  return c;
}

// Segment k, in processing order, of CTA `cta`; false when it has no more.
__device__ __forceinline__ bool plan_segment(const CtaPlan& c, int cta, int k, Segment& seg) {
  const PlanView& plan = c.plan;
  const int ctas = c.ctas, splits = c.splits;
  if (!c.equal_shares) {  // pieces: CTA c takes pieces c, c + ctas, ... (32-bit: 64-bit divisions spill)
    const int piece = cta + k * ctas;
    if (piece >= c.row_blocks * splits) return false;
    const int r = piece / splits;
    const int units = static_cast<int>(plan.field(kPlanUnits, r));
    const int chunk = (units + splits - 1) / splits;
    seg.request = static_cast<int>(plan.field(kPlanRequest, r));
    seg.block = static_cast<int>(plan.field(kPlanBlock, r));
    seg.unit_begin = min(units, (piece - r * splits) * chunk);
    seg.unit_end = min(units, seg.unit_begin + chunk);
    seg.slot = splits > 1 ? piece : -1;
    seg.row_block = r;
    return true;
  }
  if (c.first < 0) return false;
  // In item order the CTA's segments are the row blocks first, first + 1, ... that start before
  // its end.
  auto exists = [&](int i) { return c.first + i < c.row_blocks && plan.field(kPlanFirstItem, c.first + i) < c.end; };
  int i = c.defer_first ? k + 1 : k;
  if (!exists(i)) {
    if (!c.defer_first || !exists(k)) return false;
    i = 0;  // past the last segment: the deferred first one
  }
  const int r = c.first + i;
  const int64_t start = plan.field(kPlanFirstItem, r);
  const int units = static_cast<int>(plan.field(kPlanUnits, r));
  const int64_t lo = max(c.begin, start), hi = min(c.end, start + units);
  seg.request = static_cast<int>(plan.field(kPlanRequest, r));
  seg.block = static_cast<int>(plan.field(kPlanBlock, r));
  seg.unit_begin = static_cast<int>(lo - start);
  seg.unit_end = static_cast<int>(hi - start);
  seg.slot = lo == start && hi == start + units ? -1 : 2 * cta + (lo == c.begin ? 0 : 1);
  seg.row_block = r;
  return true;
}

// The partial slots of a cut row block, in unit order: slot(k) for its pieces k < count. With
// equal shares CTAs first .. first + count - 1 hold its items, each of them one piece
// (persistent_schedule.py's slots_of_row_block); with pieces, piece r * splits + k wrote slot
// r * splits + k.
struct PartialSlots {
  int first, base, step, count;
  __device__ __forceinline__ int slot(int k) const { return k == 0 ? first : base + step * k; }
};

__device__ __forceinline__ PartialSlots partial_slots(const CtaPlan& c, const Segment& seg) {
  const int r = seg.row_block;
  if (!c.equal_shares) return {r * c.splits, r * c.splits, 1, c.splits};
  const int64_t start = c.plan.field(kPlanFirstItem, r), units = c.plan.field(kPlanUnits, r);
  auto cta_of = [&](int64_t item) { return static_cast<int>(((item + 1) * c.used - 1) / c.items); };  // whose share holds it
  const int first = cta_of(start), last = cta_of(start + units - 1);
  return {2 * first + (first * c.items / c.used == start ? 0 : 1), 2 * first, 2, last - first + 1};
}

}  // namespace ddtree::sm90
