// q of the transposed e4m3 kernel (verify_attention_transposed.cuh), staged by its 256 GEMM
// threads before their pair loop: the row block's rows in fp16 under one power of two, S^T's B
// operand.
#pragma once

#include <cutlass/arch/barrier.h>

#include "numeric.cuh"
#include "transposed_operands.cuh"
#include "transposed_traits.cuh"

namespace ddtree::sm90 {

// What the q staging needs of the CTA's row block.
template <class Element>
struct TransposedQ {
  const Element* q;  // [T, H, 576]
  int64_t q_stride_token, q_stride_head;
  int64_t q_lo;                 // the request's first token
  int heads, row0, valid_rows;  // the block's first packed row and its rows (<= N)
  float scale_log2;             // sm_scale x log2(e) x kv_scale
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

// q (the block's rows n < valid_rows, zeros past them) into shared memory as fp16 times 2^-k, its
// columns permuted within each 64-column chunk (k_position_of), by GEMM thread `tid` (< 256): one
// pass over q in global memory. The thread loads its 16-byte pieces (up to nine at a time, all
// their loads in flight), stores them as they are at their places and keeps their largest
// magnitude; the threads' maxima meet in `warp_absmax` (8 floats) at a named barrier; then each
// thread rescales the words it stored, in place. A second barrier after the proxy fence lets the
// GEMMs read q. Returns the logit scale: sm_scale x log2(e) x kv_scale x 2^k.
template <int N, class Element>
__device__ __forceinline__ float stage_scaled_q(const TransposedQ<Element>& block, float (&warp_absmax)[8], uint32_t smem,
                                                int tid, uint32_t barrier_id) {
  constexpr int kUnits = kQkDim / 8;  // 16-byte pieces of a row
  constexpr int kThreads = TransposedTraits<N>::kMmaThreads;
  constexpr int kPieces = (N * kUnits + kThreads - 1) / kThreads;  // 5, 9, 18
  constexpr int kBatch = kPieces < 9 ? kPieces : 9;                 // pieces held in registers at once
  const int lane = tid % 32, warp = tid / 32;
  // The shared address of word j (columns col + 2 j, + 1 of chunk c) of piece i.
  auto word_at = [&](int i, int j) {
    const int idx = tid + i * kThreads, n = idx / kUnits, c = (idx % kUnits) / 8, col = 8 * (idx % 8);
    return smem + q_tile_byte_offset(N, n, c, k_position_of(col + 2 * j));
  };
  auto exists = [&](int i) { return tid + i * kThreads < N * kUnits; };
  float absmax = 0.f;
#pragma unroll
  for (int first = 0; first < kPieces; first += kBatch) {
    uint4 pieces[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b, idx = tid + i * kThreads, n = idx / kUnits, unit = idx % kUnits;
      pieces[b] = make_uint4(0, 0, 0, 0);
      if (i < kPieces && exists(i) && n < block.valid_rows) {
        const int row = block.row0 + n;
        const Element* const src = block.q + (block.q_lo + row / block.heads) * block.q_stride_token +
                                   (row % block.heads) * block.q_stride_head + 8 * unit;
        asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(pieces[b].x), "=r"(pieces[b].y), "=r"(pieces[b].z), "=r"(pieces[b].w)
                     : "l"(src));
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b;
      if (i >= kPieces || !exists(i)) continue;
      const uint32_t words[4] = {pieces[b].x, pieces[b].y, pieces[b].z, pieces[b].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack_pair<Element>(words[j]);
        absmax = fmaxf(absmax, fmaxf(fabsf(f.x), fabsf(f.y)));
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(word_at(i, j)), "r"(words[j]) : "memory");
      }
    }
  }
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, mask));
  if (lane == 0) warp_absmax[warp] = absmax;
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id);
  absmax = warp_absmax[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) absmax = fmaxf(absmax, warp_absmax[w]);
  const int k = q_scale_exponent(absmax);
  const float to_stage = ldexpf(1.f, -k);
#pragma unroll 1  // rolled: unrolled, the compiler keeps pass one's kPieces x 4 addresses live to here
  for (int i = 0; i < kPieces; ++i) {
    if (!exists(i)) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // the thread's own words: no barrier between their store and this load
      const uint32_t at = word_at(i, j);
      uint32_t word;
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(word) : "r"(at) : "memory");
      const float2 f = unpack_pair<Element>(word);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_pair<cutlass::half_t>(f.x * to_stage, f.y * to_stage))
                   : "memory");
    }
  }
  cutlass::arch::fence_view_async_shared();  // the GEMMs read q through the async proxy
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id);
  // A zero scale would make a masked logit's -inf times it NaN; the smallest normal float gives
  // the same softmax (every logit ~0).
  const float logit_scale = block.scale_log2 * ldexpf(1.f, k);
  return logit_scale == 0.f ? FLT_MIN : logit_scale;
}

}  // namespace ddtree::sm90
