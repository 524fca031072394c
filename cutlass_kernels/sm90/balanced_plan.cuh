// The balanced schedule of the sm_90a verify kernel, computed by every CTA from the two indptrs.
//
// The work is the list of (row block, unit) items in request, row-block, unit order, a unit being
// one pair of 64-key tiles (128 keys) of the row block's request. CTA i of the G that have work
// takes items [floor(i W / G), floor((i + 1) W / G)) of the W items, so every CTA gets the same
// number of units +-1 however unequal the requests are. A CTA walks its items as segments, one
// per row block. A segment that is a whole row block writes out/lse directly; a row block cut by
// a CTA boundary is written as fp32 partials, into slot 2 i for CTA i's first segment and 2 i + 1
// for its last, and merged by the combine (ddtree_op/balanced_combine.py), which finds the slots
// of a row block from the same formulas. ddtree_op/balanced_schedule.py is the Python reference
// that tests/test_balanced_schedule.py checks.
#pragma once

#include "../index_view.cuh"

namespace ddtree::sm90 {

constexpr int kUnitKeys = 128;  // keys per unit of work: a pair of 64-key tiles

struct RequestWork {
  int row_blocks;  // ceil(drafts * heads / 64)
  int units;       // ceil(keys / 128)
};

__device__ __forceinline__ RequestWork request_work(const IndexView& qo_indptr, const int32_t* verify_indptr, int heads,
                                                    int rows_per_block, int request) {
  const int rows = static_cast<int>(qo_indptr[request + 1] - qo_indptr[request]) * heads;
  const int keys = verify_indptr[request + 1] - verify_indptr[request];
  return {(rows + rows_per_block - 1) / rows_per_block, (keys + kUnitKeys - 1) / kUnitKeys};
}

// Where a CTA is in its list of items: the current segment is row block `block` of `request`,
// units [unit_begin, unit_end).
struct PlanCursor {
  int request, block, unit_begin, unit_end;
  RequestWork work;    // of `request`
  int64_t next, end;   // item index after this segment; end of this CTA's items
  bool first;          // the CTA's first segment
};

// Places `cursor` on the first segment of CTA `cta` of `grid_ctas`; false when it has no items.
__device__ __forceinline__ bool plan_first_segment(const IndexView& qo_indptr, const int32_t* verify_indptr, int heads,
                                                   int rows_per_block, int batch, int cta, int grid_ctas,
                                                   PlanCursor& cursor) {
  int64_t total = 0;
  for (int b = 0; b < batch; ++b) {
    const RequestWork w = request_work(qo_indptr, verify_indptr, heads, rows_per_block, b);
    total += int64_t(w.row_blocks) * w.units;
  }
  const int64_t ctas = min(int64_t(grid_ctas), total);  // CTAs past the items get none
  if (cta >= ctas) return false;
  const int64_t begin = cta * total / ctas;
  cursor.end = (cta + 1) * total / ctas;
  int64_t before = 0;
  for (int b = 0; b < batch; ++b) {
    const RequestWork w = request_work(qo_indptr, verify_indptr, heads, rows_per_block, b);
    const int64_t items = int64_t(w.row_blocks) * w.units;
    if (begin < before + items) {
      cursor.request = b;
      cursor.work = w;
      cursor.block = static_cast<int>((begin - before) / w.units);
      cursor.unit_begin = static_cast<int>((begin - before) % w.units);
      break;
    }
    before += items;
  }
  cursor.unit_end = static_cast<int>(min(int64_t(cursor.work.units), cursor.unit_begin + (cursor.end - begin)));
  cursor.next = begin + (cursor.unit_end - cursor.unit_begin);
  cursor.first = true;
  return true;
}

// Moves `cursor` to the CTA's next segment (the next row block, from its first unit); false at the end.
__device__ __forceinline__ bool plan_next_segment(const IndexView& qo_indptr, const int32_t* verify_indptr, int heads,
                                                  int rows_per_block, PlanCursor& cursor) {
  if (cursor.next >= cursor.end) return false;
  if (++cursor.block == cursor.work.row_blocks) {
    do {  // requests with no drafts have no row blocks; one with items exists since next < end
      cursor.work = request_work(qo_indptr, verify_indptr, heads, rows_per_block, ++cursor.request);
    } while (cursor.work.row_blocks == 0);
    cursor.block = 0;
  }
  cursor.unit_begin = 0;
  cursor.unit_end = static_cast<int>(min(int64_t(cursor.work.units), cursor.end - cursor.next));
  cursor.next += cursor.unit_end;
  cursor.first = false;
  return true;
}

}  // namespace ddtree::sm90
