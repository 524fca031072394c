// The gather warpgroup of the transposed e4m3 kernel (verify_attention_transposed.cuh): q into
// fp16 under one power-of-two scale, then the piece's 64-key tiles of 576-byte e4m3 rows by slot,
// with 16-byte cp.async into the stages, and each tile's keys that have a slot as bits.
#pragma once

#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "numeric.cuh"
#include "transposed_operands.cuh"
#include "transposed_traits.cuh"

namespace ddtree::sm90 {

// The pairs the GEMM warpgroups take for a piece of num_tiles tiles.
__device__ __forceinline__ int transposed_pairs_of(int num_tiles) { return max(1, (num_tiles + 1) / 2); }

// The id of the gather warps' named barrier (the GEMM warpgroups' are 1 to 4).
constexpr uint32_t kQScaleBarrier = 5;

// What the gather needs of the CTA's piece.
template <class Element>
struct TransposedGatherPlan {
  const Element* q;                 // [T, H, 576]
  int64_t q_stride_token, q_stride_head;
  const uint8_t* kv;                // the pool's e4m3 rows
  int64_t kv_row_bytes;
  const int32_t* slots;             // the request's keys; < 0: no slot
  int64_t q_lo;                     // the request's first token
  int heads, row0, valid_rows;      // the block's first packed row and its rows (<= N)
  int kv_begin, kv_end, num_tiles;  // the piece's keys, [kv_begin, kv_end) of the request's
  float scale_log2;                 // sm_scale x log2(e) x kv_scale
};

// The power of two that q's largest magnitude is scaled to [2^14, 2^15) by (fp16 has 10 mantissa
// bits from 2^-14 to 65504: the block's rows keep bf16's 8 bits over 30 binades below that), as
// the exponent k of 2^-k; 0 for a block of zeros (or of non-finite values, which stay so).
__device__ __forceinline__ int q_scale_exponent(float absmax) {
  if (!(absmax > 0.f) || !isfinite(absmax)) return 0;
  int e;
  frexpf(absmax, &e);  // absmax in [2^(e-1), 2^e)
  return max(-100, min(100, e - 15));
}

// q (the block's rows n < valid_rows, zeros past them) into shared memory as fp16 times 2^-k,
// its columns permuted within each 64-column chunk (k_position_of): S^T's B operand. Two passes
// over q (both from L2 after the first): its largest magnitude, then the scaled values. Sets
// st.logit_scale and arrives on q_full.
template <int N, class Element>
__device__ __forceinline__ void stage_scaled_q(const TransposedGatherPlan<Element>& plan, typename TransposedTraits<N>::State& st,
                                               uint64_t* q_full, uint32_t smem, int t) {
  constexpr int kUnits = kQkDim / 8;  // 16-byte pieces of a row
  const int lane = t % 32, warp = t / 32;
  auto piece_of = [&](int idx, uint4& v) {
    const int n = idx / kUnits, unit = idx % kUnits;
    if (n >= plan.valid_rows) {
      v = make_uint4(0, 0, 0, 0);
      return;
    }
    const int row = plan.row0 + n;
    const Element* const src =
        plan.q + (plan.q_lo + row / plan.heads) * plan.q_stride_token + (row % plan.heads) * plan.q_stride_head + 8 * unit;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src));
  };
  float absmax = 0.f;
  for (int idx = t; idx < N * kUnits; idx += 128) {
    uint4 v;
    piece_of(idx, v);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = unpack_pair<Element>(words[i]);
      absmax = fmaxf(absmax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, mask));
  if (lane == 0) st.q_absmax[warp] = absmax;
  cutlass::arch::NamedBarrier::sync(128, kQScaleBarrier);
  const int k = q_scale_exponent(fmaxf(fmaxf(st.q_absmax[0], st.q_absmax[1]), fmaxf(st.q_absmax[2], st.q_absmax[3])));
  const float to_stage = ldexpf(1.f, -k);
  if (t == 0) {
    // A zero scale would make a masked logit's -inf times it NaN; the smallest normal float gives
    // the same softmax (every logit ~0).
    const float logit_scale = plan.scale_log2 * ldexpf(1.f, k);
    st.logit_scale = logit_scale == 0.f ? FLT_MIN : logit_scale;
  }
  for (int idx = t; idx < N * kUnits; idx += 128) {
    uint4 v;
    piece_of(idx, v);
    const int n = idx / kUnits, c = (idx % kUnits) / 8, col = 8 * (idx % 8);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // columns col + 2 i, + 1 of chunk c: one fp16 pair at k_position_of
      const float2 f = unpack_pair<Element>(words[i]);
      const uint32_t at = smem + q_tile_byte_offset(N, n, c, k_position_of(col + 2 * i));
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_pair<cutlass::half_t>(f.x * to_stage, f.y * to_stage))
                   : "memory");
    }
  }
  cutlass::arch::fence_view_async_shared();  // the GEMMs read q through the async proxy
  cutlass::arch::ClusterBarrier::arrive(q_full);
}

// The piece's tiles into the stages (tile i into stage i % kStages, after both GEMM warpgroups
// released its previous tile), q staged after the first two tiles are issued. Lane l of warp w
// holds the slot id of the tile's key 16 w + l % 16 (-1 past the piece's keys), loaded a tile
// ahead, in one of two registers that even and odd tiles swap; the copies get their ids by
// shuffle, so no copy waits for an id's load. A key without a slot is copied as zeros and its bit
// is clear. The GEMMs take whole pairs, at least one: a piece of an odd number of tiles (or of
// none) gets empty ones, whose keys are all without a slot.
template <int N, class Element>
__device__ __forceinline__ void transposed_gather(const TransposedGatherPlan<Element>& plan, typename TransposedTraits<N>::State& st,
                                                  TransposedBarriers& bars, uint32_t smem, int t) {
  using T = TransposedTraits<N>;
  constexpr int kRowBytes = T::kRowBytes;
  const int lane = t % 32, warp = t / 32;
  const int tiles = transposed_pairs_of(plan.num_tiles) * 2;
  auto load_slot = [&](int tile) {
    const int key = plan.kv_begin + tile * T::kKeys + 16 * warp + lane % 16;
    return key < plan.kv_end ? plan.slots[key] : -1;
  };
  auto issue_tile = [&](int tile, int now, int& next) {
    next = tile + 1 < tiles ? load_slot(tile + 1) : -1;
    const int stage = tile % T::kStages;
    if (tile >= T::kStages) cutlass::arch::ClusterBarrier::wait(&bars.empty[stage], (tile / T::kStages - 1) & 1);
    const uint32_t dst = smem + T::kStagesOffset + stage * T::kStageBytes;
    auto copy = [&](int key, int unit, int slot) {
      const uint8_t* const src = slot >= 0 ? plan.kv + int64_t(slot) * plan.kv_row_bytes + 16 * unit : plan.kv;
      cp_async_16(dst + key * kRowBytes + 16 * stage_unit(key, unit), src, slot >= 0);
    };
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {  // four keys a warp instruction, 128 contiguous bytes each
      const int key = 16 * warp + 4 * i + lane / 8;
      const int slot = __shfl_sync(0xffffffffu, now, key % 16);
#pragma unroll
      for (int g = 0; g < 4; ++g) copy(key, 8 * g + lane % 8, slot);
    }
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {  // the rope's four units, eight keys a warp instruction
      const int key = 16 * warp + 8 * h + lane / 4;
      copy(key, 32 + lane % 4, __shfl_sync(0xffffffffu, now, key % 16));
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(&bars.full[stage]);
    const uint32_t bits = __ballot_sync(0xffffffffu, now >= 0) & 0xffffu;
    if (lane == 0) {
      st.key_bits[stage][warp] = static_cast<uint16_t>(bits);
      cutlass::arch::ClusterBarrier::arrive(&bars.full[stage]);
    }
  };
  int even = load_slot(0), odd;
  issue_tile(0, even, odd);
  issue_tile(1, odd, even);
  stage_scaled_q<N>(plan, st, &bars.q_full, smem, t);
  for (int tile = 2; tile < tiles; tile += 2) {
    issue_tile(tile, even, odd);
    issue_tile(tile + 1, odd, even);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
}

}  // namespace ddtree::sm90
