// The pair loop of the transposed e4m3 kernel (verify_attention_transposed.cuh), for GEMM
// warpgroup w (0, 1): S^T of tile 2 i + w, the tree mask and the online softmax of both tiles'
// rows (both warpgroups at once, three named barriers a pair), then O^T over both tiles for the
// warpgroup's 256 output columns. The A operands (K, then V^T) are widened from the e4m3 stage
// into registers group by group (transposed_operands.cuh), kBuffers - 1 groups in flight.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cta_timeline.cuh"
#include "mask_policy.cuh"
#include "numeric.cuh"
#include "softmax.cuh"  // raise_row_max
#include "transposed_clocks.cuh"
#include "transposed_operands.cuh"
#include "transposed_traits.cuh"

namespace ddtree::sm90 {

// kWords (1, 2 or 4) consecutive 32-bit words of shared memory.
template <int kWords>
__device__ __forceinline__ void ld_shared_words(uint32_t addr, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 4) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
  } else if constexpr (kWords == 2) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
  } else {
    static_assert(kWords == 1, "1, 2 or 4 words");
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[0]) : "r"(addr));
  }
}

// Reduces each of a thread's kBlocks column pairs (block j: rows 8 j + 2 q, + 1 of the
// accumulator's N) over the warp's eight key lanes (lane / 4) and leaves block lane / 4 %
// kBlocks's result in the lane: a reduce-scatter by halves, each lane keeping the half its lane
// bit names. Every index is static, so the values stay in registers.
template <int kBlocks, class Op>
__device__ __forceinline__ float2 reduce_scatter_blocks(const float2 (&v)[kBlocks], int lane, Op op) {
  float2 cur[kBlocks];
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) cur[j] = v[j];
#pragma unroll
  for (int half = kBlocks / 2; half >= 1; half /= 2) {
    const int mask = 4 * half;
    const bool upper = lane & mask;
#pragma unroll
    for (int k = 0; k < half; ++k) {
      const float2 keep = upper ? cur[k + half] : cur[k], send = upper ? cur[k] : cur[k + half];
      cur[k] = op(keep, make_float2(__shfl_xor_sync(0xffffffff, send.x, mask), __shfl_xor_sync(0xffffffff, send.y, mask)));
    }
  }
#pragma unroll
  for (int mask = 4 * kBlocks; mask < 32; mask *= 2) {
    cur[0] = op(cur[0], make_float2(__shfl_xor_sync(0xffffffff, cur[0].x, mask), __shfl_xor_sync(0xffffffff, cur[0].y, mask)));
  }
  return cur[0];
}
struct Max2 {
  __device__ float2 operator()(float2 a, float2 b) const { return make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y)); }
};
struct Sum2 {
  __device__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

// Each of the block's rows' value of a thread's N / 4 rows (index i: row 8 (i / 2) + 2 q + i % 2),
// summed or maximised over the warpgroups' 256 threads, into st.partial, then read by row thread
// t < N. The caller syncs the GEMM warpgroups between the two.
template <int N, class Op>
__device__ __forceinline__ void post_row_partials(const float2 (&part)[N / 8], float (&partial)[2][4][N], int w, int warp,
                                                  int lane, Op op) {
  const float2 warp_value = reduce_scatter_blocks(part, lane, op);
  const int g = lane / 4, q = lane % 4;
  if (g < N / 8) *reinterpret_cast<float2*>(&partial[w][warp][8 * g + 2 * q]) = warp_value;
}

// What the pair loop needs of the CTA's piece.
struct TransposedKeys {
  TreeMask mask;
  int kv_begin, row0, pairs;
  float logit_scale;  // sm_scale x log2(e) x kv_scale / q's staging scale (transposed_q.cuh)
};

// The pair loop of GEMM warpgroup w, thread t (of 128): O^T accumulates into acc_lo (m-blocks
// 0, 1) and acc_hi (2, 3), each row's sum of probabilities (this thread's part: row_sum[i],
// i as above) under the row's reference maximum (st.row_max[w]) into row_sum; its waits into
// `clock` (a debug build's, transposed_clocks.cuh).
template <int N, class AccO>
__device__ __forceinline__ void transposed_pair_loop(const TransposedKeys& keys, typename TransposedTraits<N>::State& st,
                                                     TransposedBarriers& bars, uint32_t smem, int w, int t, AccO& acc_lo,
                                                     AccO& acc_hi, float (&row_sum)[N / 4], const TransposedClock& clock) {
  using T = TransposedTraits<N>;
  using Element = typename T::Element;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kCols = N / 4, kKeys = T::kKeys;
  const int lane = t % 32, warp = t / 32, g = lane / 4, q = lane % 4;
  const int r0 = 16 * warp + g;  // the thread's keys of a tile: r0, r0 + 8

  typename T::Mma mma;
  auto thr = mma.get_slice(t);
  Element* const base = reinterpret_cast<Element*>(__cvta_shared_to_generic(smem));
  Tensor q_desc = thr.partition_fragment_B(make_tensor(make_smem_ptr(base), typename T::SmemLayoutQ{}));  // (V, 1, 36)
  Tensor p_desc0 = thr.partition_fragment_B(make_tensor(make_smem_ptr(base + T::kPOffset / 2), typename T::SmemLayoutP{}));
  Tensor p_desc1 =
      thr.partition_fragment_B(make_tensor(make_smem_ptr(base + (T::kPOffset + T::kPBytes) / 2), typename T::SmemLayoutP{}));
  Tensor acc_s = partition_fragment_C(mma, Shape<_64, Int<N>>{});  // ((2, 2, N / 8), 1, 1): key r0 + 8 r, row 8 j + 2 q + c
  auto fence_o = [&] {
    warpgroup_fence_operand(acc_lo);
    warpgroup_fence_operand(acc_hi);
  };
  using ABuffer = decltype(make_tensor<Element>(Shape<Shape<_2, _2, _2>, _1, Int<T::kSteps>>{}));
  ABuffer a_buffers[T::kBuffers];  // indexed by constants only, so they stay in registers
  const auto v_pair_layout = Layout<Shape<Shape<_2, _2, _2>, _2>>{};  // two m-blocks of V^T's A
  const uint32_t p_mine = smem + T::kPOffset + w * T::kPBytes;
  const float logit_scale = keys.logit_scale;

  for (int pair = 0; pair < keys.pairs; ++pair) {
    clock.tick();
    // S^T of tile 2 pair + w.
    const int my_tile = 2 * pair + w, my_stage_index = my_tile % T::kStages;
    const uint32_t my_stage = smem + T::kStagesOffset + my_stage_index * T::kStageBytes;
    unsigned since = clock.now();
    cutlass::arch::ClusterBarrier::wait(&bars.full[my_stage_index], (my_tile / T::kStages) & 1);
    clock.add(kTileLanding, since);
    constexpr int kSteps = T::kSteps, kGroups = T::kChunks * T::kSplit;
    // Group G: chunk G / kSplit, its words (k-steps) kSteps (G % kSplit) on.
    auto load_k = [&](int group, uint32_t (&words)[2][kSteps]) {
      const int c = group / T::kSplit;
      const uint32_t at = my_stage + k_load_byte(r0, c, q) + 4 * kSteps * (group % T::kSplit);
      ld_shared_words(at, words[0]);
      ld_shared_words(at + stage_key_byte(8), words[1]);  // key r0 + 8: four pairs on
    };
    warpgroup_fence_operand(acc_s);
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    uint32_t k_words[2][kSteps];
    load_k(0, k_words);
    cute::for_each(make_int_sequence<kGroups>{}, [&](auto group_) {
      constexpr int group = decltype(group_)::value, c = group / T::kSplit;
      auto& a = a_buffers[group % T::kBuffers];
      warpgroup_wait<T::kBuffers - 1>();  // the group that last read this buffer has retired
      warpgroup_fence_operand(a);
      widen_k_fragment(k_words, reinterpret_cast<uint32_t*>(a.data()));
      if constexpr (group + 1 < kGroups) load_k(group + 1, k_words);
      warpgroup_fence_operand(a);
      warpgroup_arrive();
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        cute::gemm(mma, a(_, _, s), q_desc(_, _, 4 * c + kSteps * (group % T::kSplit) + s), acc_s);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    });
    // The tile's keys without a slot, and the tree among the drafts (a tile that reaches them):
    // -inf. The condition is the same for the whole warpgroup.
    const uint64_t key_bits = *reinterpret_cast<const uint64_t*>(st.key_bits[my_stage_index]);
    const int kv0 = keys.kv_begin + kKeys * my_tile;
    since = clock.now();
    warpgroup_wait<0>();
    clock.add(kSRetire, since);
    warpgroup_fence_operand(acc_s);
    fence_o();
#pragma unroll
    for (int b = 0; b < T::kBuffers; ++b) warpgroup_fence_operand(a_buffers[b]);
    if (key_bits != ~uint64_t(0) || kv0 + kKeys > keys.mask.prefix_len) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int row = keys.row0 + 8 * (i / 2) + 2 * q + i % 2;
        uint64_t visible = key_bits;
        if (key_bits != 0 && row < keys.mask.num_rows) visible &= keys.mask.row_bits(kv0, row);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (!((visible >> (r0 + 8 * r)) & 1)) acc_s(4 * (i / 2) + 2 * r + i % 2) = -INFINITY;
        }
      }
    }

    // The pair's maximum of each row: over the thread's two keys, the warp's eight key lanes,
    // then (in shared memory) the four warps of both warpgroups; row thread t < N raises the
    // row's reference maximum (softmax.cuh: raise_row_max) in the warpgroup's copy.
    {
      float2 part[N / 8];
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        part[j] = make_float2(fmaxf(acc_s(4 * j), acc_s(4 * j + 2)), fmaxf(acc_s(4 * j + 1), acc_s(4 * j + 3)));
      }
      post_row_partials<N>(part, st.partial, w, warp, lane, Max2{});
    }
    since = clock.now();
    NamedBarrier::sync(T::kMmaThreads, kPartialsReady);
    clock.add(kPartnerBarriers, since);
    if (t < N) {
      float tile_max = st.partial[0][0][t];
#pragma unroll
      for (int k = 1; k < 8; ++k) tile_max = fmaxf(tile_max, st.partial[k / 4][k % 4][t]);
      const RowUpdate u = raise_row_max(st.row_max[w][t], tile_max * logit_scale);
      st.row_scale[w][t] = u.scale;
      st.row_max[w][t] = u.max;
    }
    since = clock.now();
    NamedBarrier::sync(128, kRowState0 + w);
    clock.add(kPartnerBarriers, since);
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const float2 m = *reinterpret_cast<const float2*>(&st.row_max[w][8 * j + 2 * q]);
      const float safe_x = m.x == -INFINITY ? 0.f : m.x, safe_y = m.y == -INFINITY ? 0.f : m.y;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc_s(4 * j + 2 * r) = exp2_approx(fmaf(acc_s(4 * j + 2 * r), logit_scale, -safe_x));
        acc_s(4 * j + 2 * r + 1) = exp2_approx(fmaf(acc_s(4 * j + 2 * r + 1), logit_scale, -safe_y));
      }
    }
    float factor[kCols];  // loaded after the exponentials: fewer registers live at once
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const float2 f = *reinterpret_cast<const float2*>(&st.row_scale[w][8 * j + 2 * q]);
      factor[2 * j] = f.x, factor[2 * j + 1] = f.y;
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      row_sum[i] = row_sum[i] * factor[i] + acc_s(4 * (i / 2) + i % 2) + acc_s(4 * (i / 2) + 2 + i % 2);
    }
    bool same = true;
#pragma unroll
    for (int i = 0; i < kCols; ++i) same = same && factor[i] == 1.f;
    if (!__all_sync(0xffffffff, same)) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        acc_lo(i) *= factor[2 * ((i % (N / 2)) / 4) + i % 2];
        acc_hi(i) *= factor[2 * ((i % (N / 2)) / 4) + i % 2];
      }
    }
    // P^T: this warpgroup's tile as P [row][key] (K-major, the B operand of O^T), stored
    // transposed block by block (transposed_operands.cuh: probs_store_row).
#pragma unroll
    for (int k = 0; k < N / 16; ++k) {
      uint32_t bits[4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int j = 2 * k + mi / 2, r = mi % 2;
        bits[mi] = pack_pair<Element>(acc_s(4 * j + 2 * r), acc_s(4 * j + 2 * r + 1));
      }
      const uint32_t addr = p_mine + p_tile_byte_offset(probs_store_row(k, lane), probs_store_key(warp, lane));
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(bits[0]),
                   "r"(bits[1]), "r"(bits[2]), "r"(bits[3])
                   : "memory");
    }
    cutlass::arch::fence_view_async_shared();
    since = clock.now();
    NamedBarrier::sync(T::kMmaThreads, kProbsReady);
    clock.add(kPartnerBarriers, since);

    // O^T += V^T P^T over both tiles, this warpgroup's 256 columns.
    mma.accumulate_ = GMMA::ScaleOut::One;
    fence_o();
    cute::for_each(make_int_sequence<2>{}, [&](auto t2_) {
      constexpr int t2 = decltype(t2_)::value;
      constexpr int kBlocks = T::kBlocks, kWords = kBlocks / 2;
      const int tile = 2 * pair + t2;
      const uint32_t stage = smem + T::kStagesOffset + (tile % T::kStages) * T::kStageBytes;
      // The thread's keys are 2 q on from a group's: stage_key_byte adds over an even first key.
      const uint32_t v_at = stage + stage_key_byte(2 * q) + v_load_column(w, warp, g);
      auto& p_desc = t2 == 0 ? p_desc0 : p_desc1;
      // Group (k-step s, m-half mh): kBlocks m-blocks from mh kBlocks on.
      cute::for_each(make_int_sequence<4 * T::kSplit>{}, [&](auto group_) {
        constexpr int group = decltype(group_)::value, s = group / T::kSplit, mh = group % T::kSplit;
        constexpr int k = 4 * T::kSplit * t2 + group;
        auto& a = a_buffers[k % T::kBuffers];
        uint32_t v_words[4][kWords];
#pragma unroll
        for (int he = 0; he < 4; ++he) {
          ld_shared_words(v_at + stage_key_byte(16 * s + 8 * (he / 2) + he % 2) + 4 * kWords * mh, v_words[he]);  // key + 2 q
        }
        warpgroup_wait<T::kBuffers - 1>();
        warpgroup_fence_operand(a);
        widen_v_fragment<kBlocks>(v_words, reinterpret_cast<uint32_t*>(a.data()));
        warpgroup_fence_operand(a);
        warpgroup_arrive();
        Element* const regs = raw_pointer_cast(a.data());
        if constexpr (T::kSplit == 1) {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_lo);
          cute::gemm(mma, make_tensor(regs + 16, v_pair_layout), p_desc(_, _, s), acc_hi);
        } else if constexpr (mh == 0) {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_lo);
        } else {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_hi);
        }
        warpgroup_commit_batch();
      });
      // The tile's bytes are in registers: its stage goes back to the gather.
      cutlass::arch::ClusterBarrier::arrive(&bars.empty[tile % T::kStages]);
    });
    // Waited here, not under the next S^T's first group: ptxas serialises every wgmma of the
    // loop (C7514) when O^T's last group stays in flight into the next pair.
    since = clock.now();
    warpgroup_wait<0>();
    clock.add(kORetire, since);
    fence_o();
    if (pair == 0) stamp_cta_phase(kCtaFirstPair);
  }
}

}  // namespace ddtree::sm90
