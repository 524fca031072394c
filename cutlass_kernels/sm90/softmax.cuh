// Online softmax in base 2 on a 64 x 64 S accumulator (each thread: rows my_row and my_row + 8,
// value 4 b + 2 j (+1) at row my_row + 8 j, column 8 b + 2 (lane % 4) (+1); tests/layout_check.cu).
//
// The two warpgroups take a pair's tiles in turn (the "seesaw"): warpgroup 0 raises the shared
// row maximum with its tile (scale0 = exp2(m_old - m0)), warpgroup 1 then with its own
// (scale1 = exp2(m0 - m1)); warpgroup 0 rescales what it holds by scale1 afterwards. So neither
// waits for the other's maximum before its own exponentials, and one's softmax runs under the
// other's GEMM.
#pragma once

#include <cute/tensor.hpp>

#include "numeric.cuh"

namespace ddtree::sm90 {

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// Each row's maximum (j = 0, 1: value i belongs to row (i / 2) % 2) as a tree of pairwise maxima,
// not a chain: the softmax is on the seesaw's critical path, and a chain of 16 dependent FMNMX a
// row is four times as deep.
template <class AccS>
__device__ __forceinline__ void thread_row_max(const AccS& acc_s, float (&tile_max)[2]) {
  constexpr int kPerRow = cute::size(AccS{}) / 2;
  static_assert(kPerRow == 16, "a thread holds 16 values of each of its two rows (four levels below)");
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) {
    float m[kPerRow];
    CUTE_UNROLL
    for (int k = 0; k < kPerRow; ++k) m[k] = acc_s(4 * (k / 2) + 2 * j + k % 2);
    CUTE_UNROLL
    for (int l = 0; l < 4; ++l) {  // log2(kPerRow) levels; constant trip counts keep m in registers
      CUTE_UNROLL
      for (int k = 0; k < kPerRow; k += 2 << l) m[k] = fmaxf(m[k], m[k + (1 << l)]);
    }
    tile_max[j] = m[0];
  }
}

// Scales S to base-2 logits, sets invisible columns to -inf, and returns each row's maximum.
// Most tiles (all of a long prefix) have every key visible to every row of the warp: those skip
// the bit test per element.
template <class AccS>
__device__ __forceinline__ void mask_and_row_max(AccS& acc_s, const uint64_t (&visible)[2], float scale_log2,
                                                 int quad_lane, float (&tile_max)[2]) {
  if (__all_sync(0xffffffff, (visible[0] & visible[1]) == ~uint64_t(0))) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_s); ++i) acc_s(i) *= scale_log2;
  } else {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_s); ++i) {
      const int j = (i / 2) % 2, col = 8 * (i / 4) + 2 * quad_lane + i % 2;
      acc_s(i) = (visible[j] >> col) & 1 ? acc_s(i) * scale_log2 : -INFINITY;
    }
  }
  thread_row_max(acc_s, tile_max);
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) tile_max[j] = quad_max(tile_max[j]);
}

// How far (base 2) a tile's maximum may rise above the row's before the row's maximum moves:
// probabilities then stay <= 2^8, far from overflow in bf16, fp16 and the fp32 sums, and O is
// rescaled only when a maximum jumps, which after a row's first tiles is rare.
constexpr float kMaxRiseLog2 = 8.f;

// The row's reference maximum after a tile and the factor for what was accumulated under the old
// one: the old maximum (factor exactly 1) unless the tile's is more than kMaxRiseLog2 above it.
// So it trails the row's logits by at most kMaxRiseLog2, which is all the softmax needs: the sums
// and O are both taken under it, and the lse adds it back. A row that has seen nothing keeps -inf
// and exponentiates against 0, so its probabilities are exactly 0.
struct RowUpdate {
  float max, safe_max, scale;
};
__device__ __forceinline__ RowUpdate raise_row_max(float old_max, float tile_max) {
  RowUpdate u;
  // The difference, not old_max + kMaxRiseLog2: that sum rounds up by as much as a float step of
  // old_max. True where old_max is -inf; false where tile_max is (also where both are: NaN).
  const bool moves = tile_max - old_max > kMaxRiseLog2;
  u.max = moves ? tile_max : old_max;
  u.safe_max = u.max == -INFINITY ? 0.f : u.max;
  u.scale = moves ? exp2_approx(old_max - u.safe_max) : 1.f;
  return u;
}

// acc_s(i) = exp2(acc_s(i) - safe_max of its row), probs = the same in the GEMM's type (values
// 2 k and 2 k + 1, one row's neighbours, converted together into the k-th 32-bit word of the
// compact fragment); returns this thread's part of each row's sum.
template <class AccS, class Probs>
__device__ __forceinline__ void exponentiate(AccS& acc_s, Probs& probs, const float (&safe_max)[2], float (&part_sum)[2]) {
  using Element = typename Probs::value_type;
  static_assert(cute::size(AccS{}) % 2 == 0 && sizeof(Element) == 2, "pairs of 16-bit probabilities");
  uint32_t* const words = reinterpret_cast<uint32_t*>(probs.data());
  constexpr int kBlocks = cute::size(AccS{}) / 4;  // 8 column blocks, each two values of each row
  static_assert(kBlocks == 8, "three levels of sums below");
  float block_sum[2][kBlocks];
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc_s); i += 2) {
    const int j = (i / 2) % 2;
    const float e0 = exp2_approx(acc_s(i) - safe_max[j]), e1 = exp2_approx(acc_s(i + 1) - safe_max[j]);
    acc_s(i) = e0;
    acc_s(i + 1) = e1;
    block_sum[j][i / 4] = e0 + e1;
    words[i / 2] = pack_pair<Element>(e0, e1);
  }
  // The sums as trees too (see thread_row_max).
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) {
    CUTE_UNROLL
    for (int l = 0; l < 3; ++l) {  // log2(kBlocks) levels
      CUTE_UNROLL
      for (int k = 0; k < kBlocks; k += 2 << l) block_sum[j][k] += block_sum[j][k + (1 << l)];
    }
    part_sum[j] = block_sum[j][0];
  }
}

// O (64 x 256 accumulator) times a per-row factor; skipped when no row of the warp changed.
template <class AccO>
__device__ __forceinline__ void rescale_rows(AccO& acc_o, const float (&factor)[2]) {
  if (!__any_sync(0xffffffff, factor[0] != 1.f || factor[1] != 1.f)) return;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc_o); ++i) acc_o(i) *= factor[(i / 2) % 2];
}

}  // namespace ddtree::sm90
