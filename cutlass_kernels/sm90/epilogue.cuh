// The epilogue: the normalised output tile (or its fp32 partial) through shared memory to global.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "numeric.cuh"
#include "wait_clocks.cuh"

namespace ddtree::sm90 {

using namespace cute;

// A row's factor of O (V's scale over its sum) and its lse, from its sum of exponentials and its
// maximum (base 2); a row that saw no key gets 0 and -inf.
__device__ __forceinline__ float row_output_factor(float total, float kv_scale) { return total > 0.f ? kv_scale / total : 0.f; }
__device__ __forceinline__ float row_lse(float row_max_log2, float total) {
  return total > 0.f ? (row_max_log2 + log2f(total)) * 0.6931471805599453f : -INFINITY;
}

// Store of the normalised [kRows, kCols] output tile (O times 1 / row sum), through shared memory
// so that each thread stores 16 bytes and a warp 512 contiguous bytes (from the accumulator
// layout a warp store would be 8 rows x 16..32 bytes). The caller guarantees that shared memory
// is free: no copy in flight, every wgmma read done, all threads past a barrier.
// Value 4 b + 2 j (+1) of the accumulator is row my_row + 8 j, columns col_base + 8 b + 2 (lane % 4) (+1)
// (tests/layout_check.cu). row_start(r) is the global address of row r < valid_rows. `clock` counts
// the staging and the stores apart (wait_clocks.cuh).
template <class OutT, int kRows, int kCols, int kThreads, class AccO, class CoordO, class RowStart>
__device__ __forceinline__ void store_tile_through_smem(uint8_t* smem, AccO const& acc_o, CoordO const& coord_o,
                                                        int my_row, int col_base, const float (&inv_sum)[2],
                                                        int valid_rows, int tid, RowStart row_start,
                                                        const WaitClock& clock) {
  static_assert(sizeof(OutT) == 2, "a 16-bit output: fp32 partials go through stage_half_unnormalised / store_halves");
  const long long staging_start = clock.now();
  constexpr int kStride = kCols + 16 / int(sizeof(OutT));  // one 16-byte pad: a warp's 8 rows on different banks
  OutT* staging = reinterpret_cast<OutT*>(smem);
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) {
    OutT* row = staging + (my_row + 8 * j) * kStride + col_base;
    CUTE_UNROLL
    for (int b = 0; b < size(acc_o) / 4; ++b) {
      const int i = 4 * b + 2 * j;
      *reinterpret_cast<uint32_t*>(row + get<1>(coord_o(i))) = pack_pair<OutT>(acc_o(i) * inv_sum[j], acc_o(i + 1) * inv_sum[j]);
    }
  }
  cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, 0);
  clock.add(kEpilogueStaging, staging_start);
  const long long stores_start = clock.now();
  constexpr int kVector = 16 / int(sizeof(OutT));
  constexpr int kVectorsPerRow = kCols / kVector;
#pragma unroll 4
  for (int v = tid; v < kRows * kVectorsPerRow; v += kThreads) {
    const int r = v / kVectorsPerRow, col = (v % kVectorsPerRow) * kVector;
    if (r < valid_rows) *reinterpret_cast<uint4*>(row_start(r) + col) = *reinterpret_cast<const uint4*>(staging + r * kStride + col);
  }
  clock.add(kEpilogueStores, stores_start);
}

// The fp32 partial tile in two steps, so that a warpgroup stages its half as soon as its pair loop
// ends, while the other may still run (no row sums needed yet):
// 1. stage_half_unnormalised: warpgroup w's 64 x 256 half of O into shared memory at `half`
//    (rows of kHalfStride floats: the 8-float pad puts the 4 rows of a float2 store phase on
//    different banks).
// 2. store_halves: after a barrier of both warpgroups, each row times its factor (row_factor, in
//    shared memory) from both halves (the second kHalfDistance floats after the first) to global,
//    16 bytes a thread (a warp: 512 contiguous bytes).
constexpr int kHalfStride = 256 + 8;

template <class AccO, class CoordO>
__device__ __forceinline__ void stage_half_unnormalised(float* half, AccO const& acc_o, CoordO const& coord_o, int my_row) {
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) {
    float* row = half + (my_row + 8 * j) * kHalfStride;
    CUTE_UNROLL
    for (int b = 0; b < size(acc_o) / 4; ++b) {
      const int i = 4 * b + 2 * j;
      *reinterpret_cast<float2*>(row + get<1>(coord_o(i))) = make_float2(acc_o(i), acc_o(i + 1));
    }
  }
}

template <int kRows, int kThreads, int kHalfDistance, class RowStart>
__device__ __forceinline__ void store_halves(const float* half0, const float* row_factor, int valid_rows, int tid,
                                             RowStart row_start) {
  constexpr int kVectorsPerHalfRow = 256 / 4;
#pragma unroll 4
  for (int v = tid; v < kRows * 2 * kVectorsPerHalfRow; v += kThreads) {
    const int r = v / (2 * kVectorsPerHalfRow), h = (v / kVectorsPerHalfRow) % 2, col = (v % kVectorsPerHalfRow) * 4;
    if (r >= valid_rows) continue;
    const float factor = row_factor[r];
    float4 x = *reinterpret_cast<const float4*>(half0 + h * kHalfDistance + r * kHalfStride + col);
    x.x *= factor;
    x.y *= factor;
    x.z *= factor;
    x.w *= factor;
    *reinterpret_cast<float4*>(row_start(r) + 256 * h + col) = x;
  }
}

}  // namespace ddtree::sm90
