// q of the transposed e4m3 kernel (verify_attention_transposed.cuh): the row block's rows, bulk-
// copied by the gather, staged by the 256 GEMM threads before their pair loop in fp16 under one
// power of two, S^T's B operand.
#pragma once

#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "cta_timeline.cuh"
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

// The block's q rows n < valid_rows, as they are in memory, into shared memory at `rows`
// (row n at n x 1152 bytes), one bulk copy a row: gather copy thread `copier` (0..63) copies row
// `copier`, and every copy thread arrives on `q_rows` (kTransposedCopyThreads arrivals). Issued
// before any tile, so that they are ahead of every SM's first stages in the memory's queues.
template <int N, class Element>
__device__ __forceinline__ void issue_q_rows(const TransposedQ<Element>& block, uint32_t rows, uint64_t* q_rows,
                                             int copier) {
  constexpr uint32_t kRowBytes = TransposedTraits<N>::kQRowBytes;
  const int n = copier;
  if (n < block.valid_rows) {
    const int row = block.row0 + n;
    const Element* const src =
        block.q + (block.q_lo + row / block.heads) * block.q_stride_token + (row % block.heads) * block.q_stride_head;
    arrive_expecting(q_rows, kRowBytes);
    bulk_copy(rows + n * kRowBytes, src, kRowBytes, q_rows);
  } else {
    cutlass::arch::ClusterBarrier::arrive(q_rows);
  }
}

// The magnitudes of a word's two 16-bit values as bits, whose unsigned order is the values' (NaN:
// 0, so that a NaN hides no other value of its lane from the maximum, as fmaxf skips it).
template <class Element>
__device__ __forceinline__ uint32_t magnitude_bits(uint32_t word) {
  constexpr uint32_t kInf = cute::is_same_v<Element, cutlass::bfloat16_t> ? 0x7f80u : 0x7c00u;
  const uint32_t m = word & 0x7fff7fffu;
  return m & __vcmpleu2(m, kInf << 16 | kInf);
}

// q (the block's rows n < valid_rows, zeros past them) from the rows issue_q_rows landed at
// `rows` into S^T's B operand as fp16 times 2^-k, its columns permuted within each 64-column
// chunk (k_position_of), by GEMM thread `tid` (< 256). Thread t < 216 takes one 16-byte unit
// (t % 72) of every third row from t / 72 on, so its four words' places within a row are fixed.
// The units' largest magnitude meets the other threads' in `warp_absmax` (8 floats) at a named
// barrier, then each thread stores its units scaled. A second barrier after the proxy fence lets
// the GEMMs read q. The code runs once a CTA, cold, so it is kept short.
// Returns the logit scale: sm_scale x log2(e) x kv_scale x 2^k.
template <int N, class Element>
__device__ __forceinline__ float stage_scaled_q(const TransposedQ<Element>& block, uint32_t rows, uint64_t* q_rows,
                                                float (&warp_absmax)[8], uint32_t smem, int tid, uint32_t barrier_id) {
  constexpr int kUnits = kQkDim / 8;  // 16-byte units of a row
  constexpr int kRowGroups = 3;       // rows a pass of the 216 loading threads covers
  constexpr int kRowsPerThread = (N + kRowGroups - 1) / kRowGroups;  // 6, 11, 22
  constexpr int kThreads = TransposedTraits<N>::kMmaThreads;
  constexpr uint32_t kRowBytes = TransposedTraits<N>::kQRowBytes;
  static_assert(kRowGroups * kUnits <= kThreads, "one unit a loading thread");
  const int lane = tid % 32, warp = tid / 32;
  const bool loads = tid < kRowGroups * kUnits;
  const int unit = tid % kUnits, first_row = tid / kUnits;
  const int chunk = unit / 8, col = 8 * (unit % 8);
  cutlass::arch::ClusterBarrier::wait(q_rows, 0);
  stamp_cta_phase(kCtaQLanded);
  uint4 units[kRowsPerThread];
  uint32_t pair_max = 0;  // magnitude_bits's maximum, two lanes of 16
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int n = first_row + kRowGroups * i;
    units[i] = make_uint4(0, 0, 0, 0);
    if (loads && n < block.valid_rows) {
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(units[i].x), "=r"(units[i].y), "=r"(units[i].z), "=r"(units[i].w)
                   : "r"(rows + n * kRowBytes + 16 * unit));
    }
    const uint32_t words[4] = {units[i].x, units[i].y, units[i].z, units[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) pair_max = __vmaxu2(pair_max, magnitude_bits<Element>(words[j]));
  }
  float absmax = fmaxf(unpack_pair<Element>(pair_max).x, unpack_pair<Element>(pair_max).y);
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, mask));
  if (lane == 0) warp_absmax[warp] = absmax;
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id);
  absmax = warp_absmax[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) absmax = fmaxf(absmax, warp_absmax[w]);
  const int k = q_scale_exponent(absmax);
  const float to_stage = ldexpf(1.f, -k);
  if (loads) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int n = first_row + kRowGroups * i;
      if (n >= N) continue;
      const uint32_t words[4] = {units[i].x, units[i].y, units[i].z, units[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack_pair<Element>(words[j]);
        const uint32_t at = smem + q_tile_byte_offset(N, n, chunk, k_position_of(col + 2 * j));
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_pair<cutlass::half_t>(f.x * to_stage, f.y * to_stage))
                     : "memory");
      }
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
