// What both sm_90a verify kernels (verify_attention.cuh, verify_attention_transposed.cuh) derive
// from the plan's segment, and the rows and slots a split kernel's CTA writes besides its
// segment's output: padding rows, and a row block's partial slots past its last piece.
#pragma once

#include <cutlass/numeric_types.h>

#include "../contract.cuh"
#include "tile_scheduler.cuh"
#include "verify_params.cuh"

namespace ddtree::sm90 {

// Whether this thread publishes the status: the last GEMM thread of the first CTA, whose warp is
// otherwise idle until the q tile and the first keys arrive. Read from the parameters and the
// thread's indices where it is asked, so that nothing is held across the segment loop.
template <class Traits>
__device__ __forceinline__ bool publishes_status(const VerifyParams& p) {
  return p.status.data != nullptr && blockIdx.x == 0 && threadIdx.x == Traits::kMmaThreads - 1;
}

// The segment's geometry, as both roles derive it from the plan's segment.
struct SegmentGeometry {
  int64_t q_lo;
  int num_draft, kv_lo, kv_len, num_rows, row0, kv_begin, kv_end, num_tiles;
  float* part_rows;      // fp32 partial rows, or nullptr: out/lse directly
  float* part_lse_rows;
};

template <class Traits, bool kPersistent>
__device__ __forceinline__ SegmentGeometry segment_geometry(const VerifyParams& p, const Segment& seg) {
  constexpr int kRows = Traits::kRows, kLatent = Traits::kLatent;
  SegmentGeometry g;
  g.q_lo = p.qo_indptr[seg.request];
  g.num_draft = static_cast<int>(p.qo_indptr[seg.request + 1] - g.q_lo);
  g.kv_lo = p.verify_indptr[seg.request];
  g.kv_len = p.verify_indptr[seg.request + 1] - g.kv_lo;
  g.num_rows = g.num_draft * p.heads;
  g.row0 = seg.block * kRows;
  g.kv_begin = seg.unit_begin * kUnitKeys;
  g.kv_end = min(g.kv_len, seg.unit_end * kUnitKeys);
  g.part_rows = g.part_lse_rows = nullptr;
  if (seg.slot >= 0 && kPersistent) {  // [slot, 64 rows]
    g.part_rows = p.part_out + int64_t(seg.slot) * kRows * kLatent;
    g.part_lse_rows = p.part_lse + int64_t(seg.slot) * kRows;
  } else if (seg.slot >= 0) {  // [slot, T * H rows]
    const int64_t first = seg.slot * (int64_t(p.num_tokens) * p.heads) + g.q_lo * p.heads + g.row0;
    g.part_rows = p.part_out + first * kLatent;
    g.part_lse_rows = p.part_lse + first;
  }
  g.num_tiles = g.kv_end > g.kv_begin ? (g.kv_end - g.kv_begin + Traits::kKeys - 1) / Traits::kKeys : 0;
  return g;
}

// The factor from stored to true KV values: an e4m3 cache's scale (read where it is used, after
// the preparation, so that a replay may change it), else 1.
template <bool kFp8Kv>
__device__ __forceinline__ float kv_scale_of(const VerifyParams& p) {
  if constexpr (kFp8Kv) return p.kv_scale != nullptr ? *p.kv_scale : p.kv_scale_value;
  return 1.f;
}

// Padding rows (t >= qo_indptr[B]) of the 64-row block from packed row row_begin: out 0, lse
// -inf; kMmaThreads / 64 threads zero one row's 512 columns, thread `thread` (< kMmaThreads) its
// share. The index is unsigned (threadIdx.x's type): divided as a signed int it needs a register
// more, and the persistent e4m3 kernel spills.
template <class Element, int kMmaThreads>
__device__ __forceinline__ void zero_padding_rows(const VerifyParams& p, int64_t row_begin, uint32_t thread) {
  constexpr int kThreadsPerRow = kMmaThreads / kRowsPerBlock;
  const int64_t row = row_begin + thread / kThreadsPerRow;
  if (row < int64_t(p.num_tokens) * p.heads) {
    const int64_t t = row / p.heads, h = row % p.heads;
    Element* const out_row = static_cast<Element*>(p.out) + t * p.out_stride_token + h * p.out_stride_head;
    for (int col = thread % kThreadsPerRow; col < kLatentDim; col += kThreadsPerRow) out_row[col] = Element(0.f);
    if (thread % kThreadsPerRow == 0) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = -INFINITY;
  }
}

// Split schedule, a CTA past the plan's pieces: the padding rows, in blocks of 64 over the CTAs past
// the pieces (the grid has at least one more CTA than the plan has pieces); thread `thread` (<
// kMmaThreads) its share of each.
template <class Element, int kMmaThreads>
__device__ __forceinline__ void zero_padding_past_pieces(const VerifyParams& p, const PlanView& schedule, int cta, int ctas,
                                                         uint32_t thread) {
  const int pieces = static_cast<int>(min(schedule.header(kPlanPieces), int64_t(ctas)));
  const int64_t padding_begin = p.qo_indptr[p.batch] * p.heads;
  for (int64_t r = padding_begin + int64_t(cta - pieces) * kRowsPerBlock; cta >= pieces && r < int64_t(p.num_tokens) * p.heads;
       r += int64_t(ctas - pieces) * kRowsPerBlock) {
    zero_padding_rows<Element, kMmaThreads>(p, r, thread);
  }
}

// Split schedule: the first of a row block's pieces marks its slots past the last piece as empty
// (LSE -inf), so that the combine gives them no weight and loads no partial from those past the
// shapes' splits. Thread `thread` (< 64) marks the block's row `thread`.
__device__ __forceinline__ void mark_missing_pieces(const VerifyParams& p, const Segment& seg, const SegmentGeometry& g,
                                                    int thread) {
  if (seg.slot == 0 && thread < kRowsPerBlock && g.row0 + thread < g.num_rows) {
    const int64_t slot_stride = int64_t(p.num_tokens) * p.heads;
    float* const lse_rows = p.part_lse + g.q_lo * p.heads + g.row0 + thread;
    for (int k = seg.pieces; k < kPieceSlotsPerSplit * p.num_splits; ++k) lse_rows[k * slot_stride] = -INFINITY;
  }
}

}  // namespace ddtree::sm90
