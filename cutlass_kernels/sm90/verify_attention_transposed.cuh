// The transposed e4m3 kernel of the split schedule: a CTA per piece of the plan (a row block of
// one request and a range of its keys, tile_scheduler.cuh), as verify_attention.cuh's split
// kernel, for an e4m3 cache. The e4m3 tiles stay e4m3 in shared memory (half the bytes of a
// widened tile, so five stages in flight) and the GEMMs are transposed (transposed_traits.cuh),
// so their N is the block's rows: 16, 32 or 64, the smallest that holds them, chosen per CTA.
// Warpgroup 2 gathers (transposed_gather.cuh); warpgroups 0 and 1 stage q (transposed_q.cuh),
// run the pair loop (transposed_mainloop.cuh) and store the output, or a piece's fp32 partial,
// from registers: O^T gives a thread eight consecutive columns of each of its rows.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "../grid_dependency.cuh"
#include "../status.cuh"
#include "cta_timeline.cuh"
#include "epilogue.cuh"  // row_output_factor, row_lse
#include "segment.cuh"
#include "tile_scheduler.cuh"
#include "traits.cuh"  // VerifyTraits: the plan's row blocks and tiles
#include "transposed_clocks.cuh"
#include "transposed_gather.cuh"
#include "transposed_mainloop.cuh"
#include "transposed_q.cuh"
#include "transposed_traits.cuh"
#include "verify_launch.cuh"
#include "verify_params.cuh"

namespace ddtree::sm90 {

// The output of GEMM warpgroup w's thread t: each of its rows' sum over both warpgroups, the lse
// (row thread t < N of warpgroup 0) and the thread's eight columns 256 w + 8 (8 warp + lane / 4)
// of each of its rows, times the row's factor; to out/lse, or to the piece's fp32 partial rows.
template <int N, class Element, class AccO>
__device__ __forceinline__ void store_transposed_output(const VerifyParams& p, const SegmentGeometry& g, int valid_rows,
                                                        typename TransposedTraits<N>::State& st, int w, int t,
                                                        const AccO& acc_lo, const AccO& acc_hi, const float (&row_sum)[N / 4]) {
  using T = TransposedTraits<N>;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kCols = N / 4;
  const int lane = t % 32, warp = t / 32, g8 = lane / 4, q = lane % 4;
  {
    float2 part[N / 8];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) part[j] = make_float2(row_sum[2 * j], row_sum[2 * j + 1]);
    post_row_partials<N>(part, st.partial, w, warp, lane, Sum2{});
  }
  NamedBarrier::sync(T::kMmaThreads, kPartialsReady);
  auto row_index = [&](int n) {  // row n of the block: its token and head
    const int row = g.row0 + n;
    return make_int2(row / p.heads, row % p.heads);
  };
  if (t < N) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) total += st.partial[k / 4][k % 4][t];
    st.row_scale[w][t] = row_output_factor(total, kv_scale_of<true>(p));
    if (w == 0 && t < valid_rows) {
      const float lse = row_lse(st.row_max[w][t], total);
      if (g.part_lse_rows != nullptr) {
        g.part_lse_rows[t] = lse;
      } else {
        const int2 th = row_index(t);
        p.lse[(g.q_lo + th.x) * p.lse_stride_token + th.y * p.lse_stride_head] = lse;
      }
    }
  }
  NamedBarrier::sync(128, kRowState0 + w);
  const int col = 256 * w + 8 * (8 * warp + g8);
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int n = 8 * (i / 2) + 2 * q + i % 2;
    if (n >= valid_rows) continue;
    const float f = st.row_scale[w][n];
    float v[8];  // columns col + 2 bm + r
#pragma unroll
    for (int bm = 0; bm < 4; ++bm) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int at = i % 2 + 2 * r + 4 * (i / 2) + (N / 2) * (bm % 2);
        v[2 * bm + r] = (bm < 2 ? acc_lo(at) : acc_hi(at)) * f;
      }
    }
    if (g.part_rows != nullptr) {
      float4* const dst = reinterpret_cast<float4*>(g.part_rows + int64_t(n) * kLatentDim + col);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      const int2 th = row_index(n);
      Element* const dst = static_cast<Element*>(p.out) + (g.q_lo + th.x) * p.out_stride_token + th.y * p.out_stride_head + col;
      *reinterpret_cast<uint4*>(dst) = make_uint4(pack_pair<Element>(v[0], v[1]), pack_pair<Element>(v[2], v[3]),
                                                  pack_pair<Element>(v[4], v[5]), pack_pair<Element>(v[6], v[7]));
    }
  }
}

// The block's q rows, for the gather's bulk copies and the GEMM threads' staging.
template <int N, class Element>
__device__ __forceinline__ TransposedQ<Element> transposed_q_block(const VerifyParams& p, const SegmentGeometry& g) {
  TransposedQ<Element> q_block;
  q_block.q = static_cast<const Element*>(p.q);
  q_block.q_stride_token = p.q_stride_token;
  q_block.q_stride_head = p.q_stride_head;
  q_block.q_lo = g.q_lo;
  q_block.heads = p.heads;
  q_block.row0 = g.row0;
  q_block.valid_rows = min(N, g.num_rows - g.row0);
  q_block.scale_log2 = p.scale_log2 * kv_scale_of<true>(p);
  return q_block;
}

// The CTA's piece with N rows a GEMM (its block's rows <= N).
template <int N, class Element>
__device__ __forceinline__ void transposed_piece(const VerifyParams& p, const Segment& s_seg, const SegmentGeometry& s_g,
                                                 TransposedBarriers& bars, uint8_t* smem_ptr) {
  using T = TransposedTraits<N>;
  auto& st = *reinterpret_cast<typename T::State*>(smem_ptr + T::kStateOffset);
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  if (warpgroup == 2) {
    cutlass::arch::warpgroup_reg_dealloc<T::kGatherRegisters>();
    const SegmentGeometry g = s_g;
    TransposedGatherPlan plan;
    plan.kv = static_cast<const uint8_t*>(p.kv);
    plan.kv_row_bytes = p.kv_stride;  // e4m3: a byte an element
    plan.slots = p.verify_indices + g.kv_lo;
    plan.kv_begin = g.kv_begin;
    plan.kv_end = g.kv_end;
    plan.num_tiles = g.num_tiles;
    transposed_gather<N>(plan, transposed_q_block<N, Element>(p, g), st, bars, smem, t);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<T::kMmaRegisters>();
  const Segment seg = s_seg;
  const SegmentGeometry g = s_g;
  mark_missing_pieces(p, seg, g, threadIdx.x);
  if (publishes_status<VerifyTraits<Element>>(p)) publish_status(p.status);
  if (t < N) st.row_max[warpgroup][t] = -INFINITY;  // read by this thread first, by the others after a barrier
  TransposedKeys keys;
  keys.mask = TreeMask{p.mask_words, p.mask_stride, g.q_lo, p.heads, g.num_draft, g.num_rows, g.kv_len - g.num_draft};
  keys.kv_begin = g.kv_begin;
  keys.row0 = g.row0;
  keys.pairs = transposed_pairs_of(g.num_tiles);
  const TransposedQ<Element> q_block = transposed_q_block<N, Element>(p, g);
  const TransposedClock clock = transposed_clock(st, warpgroup, t == 0);
  const unsigned staging = clock.now();
  keys.logit_scale =
      stage_scaled_q<N>(q_block, smem + T::kQRowsOffset, &bars.q_rows, st.q_absmax, smem, threadIdx.x, kPartialsReady);
  clock.add(kQStaging, staging);
  cutlass::arch::NamedBarrier::arrive(T::kThreads, kQStaged);  // the gather may issue the rest
  stamp_cta_phase(kCtaQReady);
  typename T::Mma mma;
  // O^T in two accumulators of two m-blocks each (m-blocks 0, 1 and 2, 3: output columns by
  // v_output_column), so that an O^T group of two m-blocks names one of them.
  Tensor acc_lo = partition_fragment_C(mma, Shape<_128, Int<N>>{});  // ((2, 2, N / 8), 2, 1)
  Tensor acc_hi = partition_fragment_C(mma, Shape<_128, Int<N>>{});
  clear(acc_lo);
  clear(acc_hi);
  float row_sum[N / 4];
#pragma unroll
  for (int i = 0; i < N / 4; ++i) row_sum[i] = 0.f;
  transposed_pair_loop<N>(keys, st, bars, smem, warpgroup, t, acc_lo, acc_hi, row_sum, clock);
  stamp_cta_phase(kCtaLoopDone);
  store_transposed_output<N, Element>(p, g, q_block.valid_rows, st, warpgroup, t, acc_lo, acc_hi, row_sum);
  clock.store(warpgroup, N);
  stamp_cta_phase(kCtaStored);
}

template <class Element>
__global__ void __launch_bounds__(TransposedTraits<16>::kThreads, 1)
    verify_attention_transposed_kernel(const __grid_constant__ VerifyParams p) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ TransposedBarriers bars;
  // The 128-byte swizzle wants 1 KB alignment; the launch asks for 1 KB of slack.
  const uint32_t align_pad = (1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u;
  uint8_t* const smem = smem_raw + align_pad;
  // Set-up that reads nothing another kernel writes, while the preparation may still run.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMaxTransposedStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&bars.full[s], kTransposedCopyThreads);  // one arrival a key
      cutlass::arch::ClusterBarrier::init(&bars.empty[s], TransposedTraits<16>::kMmaThreads);
    }
    cutlass::arch::ClusterBarrier::init(&bars.q_rows, kTransposedCopyThreads);
    cutlass::arch::fence_barrier_init();
  }
  stamp_cta_phase(kCtaLaunch);
  wait_for_prior_grids();
  allow_dependent_grids();  // the combine may launch; it waits for this grid before reading
  stamp_cta_phase(kCtaEntry);
  __syncthreads();

  const PlanView schedule{p.plan, plan_capacity(p.num_tokens, p.heads, p.batch)};
  const int block = blockIdx.x, ctas = static_cast<int>(gridDim.x);
  Segment seg{};
  if (!plan_piece(schedule, p.heads, p.num_splits, block, seg)) {
    constexpr int kMmaThreads = TransposedTraits<16>::kMmaThreads;
    if (threadIdx.x < kMmaThreads) zero_padding_past_pieces<Element, kMmaThreads>(p, schedule, block, ctas, threadIdx.x);
    if (publishes_status<VerifyTraits<Element>>(p)) publish_status(p.status);
    return;
  }
  // The piece reaches both roles through shared memory: held in registers across their
  // setmaxnreg, it spills.
  __shared__ Segment s_seg;
  __shared__ SegmentGeometry s_g;
  const SegmentGeometry g = segment_geometry<VerifyTraits<Element>, false>(p, seg);
  const int rows = g.num_rows - g.row0;  // 1..64
  if (threadIdx.x == 0) {
    s_seg = seg;
    s_g = g;
  }
  __syncthreads();
  if (rows <= 16) {
    transposed_piece<16, Element>(p, s_seg, s_g, bars, smem);
  } else if (rows <= 32) {
    transposed_piece<32, Element>(p, s_seg, s_g, bars, smem);
  } else {
    transposed_piece<64, Element>(p, s_seg, s_g, bars, smem);
  }
}

template <class Element>
void launch_verify_attention_transposed(const VerifyParams& params, dim3 grid, cudaStream_t stream) {
  auto kernel = verify_attention_transposed_kernel<Element>;
  const int smem = kTransposedSmemBytes + 1024;  // + alignment slack for the swizzled tiles
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  C10_CUDA_CHECK(launch_dependent(kernel, grid, dim3(TransposedTraits<16>::kThreads), smem, stream, params));
  print_transposed_clocks_after(stream);
  print_cta_timeline_after(stream, static_cast<int>(grid.x), kTimelineTransposed);
}

}  // namespace ddtree::sm90
