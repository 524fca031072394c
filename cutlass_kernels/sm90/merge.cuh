// The persistent kernel's merge of a row block cut into pieces (tile_scheduler.cuh's
// PartialSlots): each piece writes its fp32 partial, and the CTA that writes the last one adds them
// all up in slot order, so that the result does not depend on which CTA came last. No combine
// launch follows the kernel.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "mainloop.cuh"
#include "numeric.cuh"

namespace ddtree::sm90 {

// Counts a partial that kThreads threads have just stored; true, in every one of them, when it is
// the row block's last (`pieces` in all). `written` is the row block's count in the plan, which
// the last piece sets back to 0 for the next launch (every piece of this launch has counted).
template <int kThreads>
__device__ __forceinline__ bool wrote_last_partial(unsigned long long* written, int pieces, int tid) {
  using cutlass::arch::NamedBarrier;
  __shared__ int s_last;
  __threadfence();  // this thread's stores of the partial, before the count that publishes them
  NamedBarrier::arrive_and_wait(kThreads, kEpilogueBarrier);
  if (tid == 0) {
    const bool last = atomicAdd(written, 1ull) + 1 == static_cast<unsigned long long>(pieces);
    if (last) atomicExch(written, 0ull);
    s_last = last;
  }
  NamedBarrier::arrive_and_wait(kThreads, kEpilogueBarrier);
  const bool last = s_last;
  if (last) __threadfence();  // the other pieces' partials, seen through the count, before they are read
  return last;
}

// Merges the row block's partials (normalised rows part_out [slot, kRows, kCols] and their LSEs
// part_lse [slot, kRows], natural log; a slot whose LSE is -inf saw no key, and its rows are not
// read) into out rows row_start(r) and lse_at(r), for r < valid_rows. kThreads / kRows threads a
// row, each 16-byte pieces of it, kBatch of them loaded at a time. The partials are read from L2
// (other SMs wrote them during this launch).
template <class OutT, int kRows, int kCols, int kThreads, class Slots, class RowStart, class LseAt>
__device__ __forceinline__ void merge_partials(const float* part_out, const float* part_lse, const Slots& slots,
                                               int valid_rows, int tid, RowStart row_start, LseAt lse_at) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  constexpr int kVectors = kCols / 4 / kThreadsPerRow;  // float4 a thread
  constexpr int kBatch = 16;
  static_assert(kThreads % kRows == 0 && kVectors % kBatch == 0, "whole rows, whole batches");
  const int r = tid / kThreadsPerRow, lane = tid % kThreadsPerRow;
  if (r >= valid_rows) return;
  auto lse_of = [&](int k) { return __ldcg(part_lse + int64_t(slots.slot(k)) * kRows + r); };
  float max_lse = -INFINITY;
  for (int k = 0; k < slots.count; ++k) max_lse = fmaxf(max_lse, lse_of(k));
  auto weight_of = [&](int k) { return max_lse == -INFINITY ? 0.f : expf(lse_of(k) - max_lse); };
  float total = 0.f;
  for (int k = 0; k < slots.count; ++k) total += weight_of(k);
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  OutT* const out_row = row_start(r);
  CUTE_UNROLL
  for (int v0 = 0; v0 < kVectors; v0 += kBatch) {
    float4 acc[kBatch];
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < slots.count; ++k) {
      const float w = weight_of(k);
      if (w == 0.f) continue;  // no key, or too small to count: its bytes are not trusted
      const float4* row = reinterpret_cast<const float4*>(part_out + (int64_t(slots.slot(k)) * kRows + r) * kCols);
      CUTE_UNROLL
      for (int j = 0; j < kBatch; ++j) {
        const float4 x = __ldcg(row + (v0 + j) * kThreadsPerRow + lane);
        acc[j].x += w * x.x;
        acc[j].y += w * x.y;
        acc[j].z += w * x.z;
        acc[j].w += w * x.w;
      }
    }
    CUTE_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int col = ((v0 + j) * kThreadsPerRow + lane) * 4;
      if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float4*>(out_row + col) =
            make_float4(acc[j].x * inv_total, acc[j].y * inv_total, acc[j].z * inv_total, acc[j].w * inv_total);
      } else {
        *reinterpret_cast<uint2*>(out_row + col) = make_uint2(pack_pair<OutT>(acc[j].x * inv_total, acc[j].y * inv_total),
                                                              pack_pair<OutT>(acc[j].z * inv_total, acc[j].w * inv_total));
      }
    }
  }
  if (lane == 0) *lse_at(r) = total > 0.f ? max_lse + logf(total) : -INFINITY;
}

}  // namespace ddtree::sm90
