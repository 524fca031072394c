// Tree-masked MLA verify attention for sm_90a: wgmma (HGMMA) for Q K^T and P V, cp.async
// gather of scattered 576-wide KV rows into swizzled shared memory, online softmax in fp32.
//
// Two kernels, both with grids that are functions of shapes only (the rest is found on the device):
// - split (kPersistent = false): grid (row blocks + B + 1, key splits). Block x of request b covers
//   packed rows [64 * (x - first block of b), +64) of that request, row = draft * H + head, and
//   split y the y-th equal share of its keys; leftover blocks write the padding rows
//   (t >= qo_indptr[B]). With one split the kernel writes out/lse; with more, fp32 partials that
//   a combine merges by LSE.
// - persistent (kPersistent = true): grid (CTAs), each walking a list of segments (a row block and
//   a range of its keys) that every CTA plans from the indptrs: the split schedule's pieces, or,
//   when requests are unequal, equal shares of all the work (balanced_plan.cuh).
//
// Per CTA: 2 warpgroups and pairs of 64-key tiles. Warpgroup w computes S = Q K^T (64 x 64
// over 576) for tile w of the pair only; the two exchange row maxima and P through shared memory
// (P goes into the tile's rope block, free once its S is done), and warpgroup w accumulates
// output columns [256 w, 256 w + 256) over both tiles. KV tiles: 2 stages with a full and an
// empty mbarrier each; stage 0 is refilled while stage 1's P V runs.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "../index_view.cuh"
#include "balanced_plan.cuh"
#include "traits.cuh"

namespace ddtree::sm90 {

struct VerifyParams {
  const void* q;
  int64_t q_stride_token, q_stride_head;
  const void* kv;
  int64_t kv_stride;
  IndexView qo_indptr;
  const int32_t* verify_indptr;
  const int32_t* verify_indices;
  const int64_t* mask_words;
  int64_t mask_stride;
  void* out;
  int64_t out_stride_token, out_stride_head;
  float* lse;
  int64_t lse_stride_token, lse_stride_head;
  float* part_out;  // [splits, T * H, 512] when splits > 1
  float* part_lse;  // [splits, T * H]
  int num_tokens, heads, batch, num_splits;
  // Persistent kernel (grid = CTAs): part_out is [2 * CTAs, 64, 512] and part_lse [2 * CTAs, 64],
  // num_splits the pieces schedule's splits per row block (balanced_plan.cuh).
  float scale_log2;  // sm_scale * log2(e)
};

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_size = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_size));
}

// With kOpaque, a copy of v that the compiler cannot see through: values derived from it are not
// hoisted out of the loop that computes it.
template <bool kOpaque>
__device__ __forceinline__ int opaque_if(int v) {
  if constexpr (kOpaque) asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}
template <bool kOpaque>
__device__ __forceinline__ uint8_t* opaque_if(uint8_t* v) {
  if constexpr (kOpaque) asm volatile("mov.b64 %0, %0;" : "+l"(v));
  return v;
}

// Two adjacent output columns as one 32-bit word (lower address first).
template <class Element>
__device__ __forceinline__ uint32_t pack_pair(float first, float second) {
  return uint32_t(Element(first).raw()) | (uint32_t(Element(second).raw()) << 16);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// Visibility bits of 64 consecutive key columns whose first one is draft column `first_draft`
// (negative: the tile starts -first_draft columns before the drafts, in the prefix, all visible).
// `words` is the row's compact mask: bit d of word d / 64 = draft column d visible.
__device__ __forceinline__ uint64_t tile_visibility(const int64_t* words, int first_draft, int num_draft) {
  if (first_draft < 0) {
    const int prefix_cols = -first_draft;  // 1..63
    return ((1ull << prefix_cols) - 1) | (static_cast<uint64_t>(words[0]) << prefix_cols);
  }
  const int w = first_draft / 64, shift = first_draft % 64;
  uint64_t bits = static_cast<uint64_t>(words[w]) >> shift;
  if (shift != 0 && (w + 1) * 64 < num_draft) bits |= static_cast<uint64_t>(words[w + 1]) << (64 - shift);
  return bits;
}

// Issues a warpgroup GEMM over all k-blocks (kZeroInit: acc = A B, else acc += A B); the caller
// waits for it with wait_warpgroup_gemm, so it can signal other warps in between.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void issue_warpgroup_gemm(TiledMma& mma, TA const& a, TB const& b, TC& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

template <class TC>
__device__ __forceinline__ void wait_warpgroup_gemm(TC& acc) {
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

// Epilogue store of the normalised [kRows, kCols] output tile (O times 1 / row sum), through
// shared memory so that each thread stores 16 bytes and a warp 512 contiguous bytes. Stored
// straight from the accumulator layout (a warp store = 8 rows x 16..32 bytes) it took 6-14 K
// cycles per CTA (phase clocks, bench/results/2026-11-30_H200x2_9583d81). The caller guarantees
// that shared memory is free: no copy in flight, every wgmma read done, all threads past a barrier.
// Value 4 b + 2 j (+1) of the accumulator is row my_row + 8 j, columns col_base + 8 b + 2 (lane % 4) (+1)
// (tests/layout_check.cu). row_start(r) is the global address of row r < valid_rows.
template <class OutT, int kRows, int kCols, int kThreads, class AccO, class CoordO, class RowStart>
__device__ __forceinline__ void store_tile_through_smem(uint8_t* smem, AccO const& acc_o, CoordO const& coord_o,
                                                        int my_row, int col_base, const float (&inv_sum)[2],
                                                        int valid_rows, int tid, RowStart row_start) {
  constexpr int kStride = kCols + 16 / int(sizeof(OutT));  // one 16-byte pad: a warp's 8 rows on different banks
  OutT* staging = reinterpret_cast<OutT*>(smem);
  CUTE_UNROLL
  for (int j = 0; j < 2; ++j) {
    OutT* row = staging + (my_row + 8 * j) * kStride + col_base;
    CUTE_UNROLL
    for (int b = 0; b < size(acc_o) / 4; ++b) {
      const int i = 4 * b + 2 * j;
      const float first = acc_o(i) * inv_sum[j], second = acc_o(i + 1) * inv_sum[j];
      if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float2*>(row + get<1>(coord_o(i))) = make_float2(first, second);
      } else {
        *reinterpret_cast<uint32_t*>(row + get<1>(coord_o(i))) = pack_pair<OutT>(first, second);
      }
    }
  }
  cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, 0);
  constexpr int kVector = 16 / int(sizeof(OutT));
  constexpr int kVectorsPerRow = kCols / kVector;
#pragma unroll 4
  for (int v = tid; v < kRows * kVectorsPerRow; v += kThreads) {
    const int r = v / kVectorsPerRow, col = (v % kVectorsPerRow) * kVector;
    if (r < valid_rows) *reinterpret_cast<uint4*>(row_start(r) + col) = *reinterpret_cast<const uint4*>(staging + r * kStride + col);
  }
}

// Debug builds only (DDTREE_NVCC_EXTRA=-DDDTREE_PHASE_CLOCKS python -m bench.profile_case CASE): thread
// 0 of every 8th split of row block 0 prints the SM cycles each phase of its CTA took.
#ifdef DDTREE_PHASE_CLOCKS
#define DDTREE_PHASE(i) \
  do {                    \
    if (tid == 0) phase_cycles[i] = clock64(); \
  } while (0)
#else
#define DDTREE_PHASE(i) \
  do {                  \
  } while (0)
#endif

template <class Traits, bool kPersistent>
__global__ void __launch_bounds__(Traits::kThreads, 1) verify_attention_kernel(const __grid_constant__ VerifyParams p) {
  using Element = typename Traits::Element;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kChunks = Traits::kChunksPerRow;
  constexpr int kLatent = Traits::kLatent, kHalf = Traits::kHalf, kThreads = Traits::kThreads;

  extern __shared__ uint8_t smem_raw[];
  // SW128 atoms need 1024-byte alignment; the launch asks for 1 KB of slack.
  uint8_t* const smem_base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // Per stage: `full` completes when every thread's cp.async of the tile has landed (256 async
  // arrivals); `empty` when every thread has finished its wgmma reads of the tile (256 arrivals).
  auto full_barriers = [](uint8_t* smem) {
    return reinterpret_cast<uint64_t*>(smem + Traits::kSmemQ + Traits::kStages * Traits::kSmemK);
  };
  const int tid = threadIdx.x;
  const int block = blockIdx.x;
  const int split = blockIdx.y;
#ifdef DDTREE_PHASE_CLOCKS
  long long phase_cycles[10] = {};
  unsigned long long start_ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start_ns));
#endif
  DDTREE_PHASE(0);

  Element* const out = static_cast<Element*>(p.out);
  // Padding rows (t >= qo_indptr[B]): out 0, lse -inf; 4 threads zero one row's 512 columns.
  auto zero_padding_block = [&](int64_t row_begin) {
    constexpr int kThreadsPerRow = kThreads / kRows;
    const int64_t row = row_begin + tid / kThreadsPerRow;
    if (row < int64_t(p.num_tokens) * p.heads) {
      const int64_t t = row / p.heads, h = row % p.heads;
      Element* out_row = out + t * p.out_stride_token + h * p.out_stride_head;
      for (int col = tid % kThreadsPerRow; col < kLatent; col += kThreadsPerRow) out_row[col] = Element(0.f);
      if (tid % kThreadsPerRow == 0) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = -INFINITY;
    }
  };

  // The first segment: a row block of one request and a range of its keys. Split schedule: the
  // CTA's (block, split) alone. Persistent schedule: the plan's (balanced_plan.cuh).
  const PlanInputs plan_inputs{p.qo_indptr, p.verify_indptr, p.heads, kRows, p.batch, static_cast<int>(gridDim.x), p.num_splits};
  BatchPlan batch_plan{};
  Segment seg{};
  if constexpr (kPersistent) {
    batch_plan = plan_batch(plan_inputs);
    const int64_t padding_begin = p.qo_indptr[p.batch] * p.heads;
    for (int64_t r = padding_begin + int64_t(block) * kRows; r < int64_t(p.num_tokens) * p.heads; r += int64_t(gridDim.x) * kRows) {
      zero_padding_block(r);
    }
    if (!plan_segment(plan_inputs, batch_plan, block, 0, seg)) return;
  } else {
    // Which request owns this block (the batch is small: a linear scan, all from L1/L2).
    int first_block = 0, blocks_before = 0;
    seg.request = -1;
    for (int b = 0; b < p.batch; ++b) {
      const int rows = static_cast<int>(p.qo_indptr[b + 1] - p.qo_indptr[b]) * p.heads;
      const int blocks = (rows + kRows - 1) / kRows;
      if (seg.request < 0 && block < blocks_before + blocks) {
        seg.request = b;
        first_block = blocks_before;
      }
      blocks_before += blocks;
    }
    if (seg.request < 0) {  // padding rows (split 0 only)
      if (split == 0) zero_padding_block(p.qo_indptr[p.batch] * p.heads + int64_t(block - blocks_before) * kRows);
      return;
    }
    seg.block = block - first_block;
  }
  DDTREE_PHASE(1);

  using Barrier = cutlass::arch::ClusterBarrier;
  if (tid == 0) {
    uint64_t* full_barrier = full_barriers(smem_base);
    uint64_t* empty_barrier = full_barrier + Traits::kStages;
    for (int stage = 0; stage < Traits::kStages; ++stage) {
      Barrier::init(&full_barrier[stage], kThreads);
      Barrier::init(&empty_barrier[stage], kThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  int pairs_done = 0;  // pairs of earlier segments: every barrier completed one phase per pair
  for (int segment = 0;; ++segment) {
    // In the persistent kernel, the body's thread and shared-memory addresses derive from copies
    // the compiler cannot see through (opaque), so it recomputes them per segment instead of
    // hoisting them out of this loop and holding them live across it (that spilled 1.6 KB a thread).
    const int tid = opaque_if<kPersistent>(static_cast<int>(threadIdx.x));  // shadows the one above on purpose
    uint8_t* const smem = opaque_if<kPersistent>(smem_base);
    const int warpgroup = tid / 128;
    const int wg_thread = tid % 128;
    Element* smem_q = reinterpret_cast<Element*>(smem);
    Element* smem_k = reinterpret_cast<Element*>(smem + Traits::kSmemQ);
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
    uint64_t* full_barrier = full_barriers(smem);
    uint64_t* empty_barrier = full_barrier + Traits::kStages;
    float* row_exchange = reinterpret_cast<float*>(empty_barrier + Traits::kStages);  // [warpgroup][row]

    const int request = seg.request;
    const int64_t q_lo = p.qo_indptr[request];
    const int num_draft = static_cast<int>(p.qo_indptr[request + 1] - q_lo);
    const int kv_lo = p.verify_indptr[request];
    const int kv_len = p.verify_indptr[request + 1] - kv_lo;
    const int prefix_len = kv_len - num_draft;
    const int num_rows = num_draft * p.heads;
    const int row0 = seg.block * kRows;

    // Key range and destination: out/lse, or the fp32 partial rows (one row block's rows are consecutive).
    int kv_begin, kv_end;
    float* part_rows = nullptr;
    float* part_lse_rows = nullptr;
    if constexpr (kPersistent) {
      kv_begin = seg.unit_begin * kUnitKeys;
      kv_end = min(kv_len, seg.unit_end * kUnitKeys);
      if (seg.slot >= 0) {
        part_rows = p.part_out + int64_t(seg.slot) * kRows * kLatent;
        part_lse_rows = p.part_lse + int64_t(seg.slot) * kRows;
      }
    } else {
      const int per_split = (kv_len + p.num_splits - 1) / p.num_splits;
      constexpr int kPairKeys = 2 * kKeys;  // splits hold whole pairs of tiles, so only the last pads
      const int chunk = (per_split + kPairKeys - 1) / kPairKeys * kPairKeys;
      kv_begin = split * chunk;
      kv_end = min(kv_len, kv_begin + chunk);
      if (p.num_splits > 1) {
        const int64_t first = split * (int64_t(p.num_tokens) * p.heads) + q_lo * p.heads + row0;
        part_rows = p.part_out + first * kLatent;
        part_lse_rows = p.part_lse + first;
      }
    }
    const int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kKeys - 1) / kKeys : 0;

    const Element* q_ptr = static_cast<const Element*>(p.q);
    const Element* kv_ptr = static_cast<const Element*>(p.kv);
    // Gather: each thread copies one key's row in every tile (kThreadsPerKey threads share a row,
    // interleaved 16-byte chunks), so it needs one slot id per tile. The ids of the next pair's
    // tiles are loaded a pair ahead, so no cp.async waits on an index load.
    constexpr int kThreadsPerKey = kThreads / kKeys;
    const int gather_key = tid / kThreadsPerKey, gather_chunk0 = tid % kThreadsPerKey;
    auto slot_of_tile = [&](int tile) -> int {  // -1: past the range (zero-filled)
      const int kv = kv_begin + tile * kKeys + gather_key;
      return tile < num_tiles && kv < kv_end ? p.verify_indices[kv_lo + kv] : -1;
    };
    auto gather_kv_tile = [&](int stage, int slot) {
      Tensor sK = make_tensor(make_smem_ptr(smem_k + stage * cosize_v<typename Traits::SmemLayoutK>),
                              typename Traits::SmemLayoutK{});
      const Element* row = kv_ptr + int64_t(slot < 0 ? 0 : slot) * p.kv_stride;
      CUTE_UNROLL
      for (int c = gather_chunk0; c < kChunks; c += kThreadsPerKey) {
        cp_async_16(&sK(gather_key, c * 8), row + c * 8, slot >= 0);
      }
    };

    int next_slot[2] = {-1, -1};  // slot ids of the next pair's tiles, loaded a pair ahead
    if (num_tiles > 0) {
      // q rows the same way as KV rows: 4 threads per row, so one (token, head) split per thread.
      const int q_row = row0 + gather_key;
      const bool q_valid = q_row < num_rows;
      const int64_t q_token = q_lo + (q_valid ? q_row / p.heads : 0), q_head = q_valid ? q_row % p.heads : 0;
      const Element* q_src = q_ptr + q_token * p.q_stride_token + q_head * p.q_stride_head;
      CUTE_UNROLL
      for (int c = gather_chunk0; c < kChunks; c += kThreadsPerKey) {
        cp_async_16(&sQ(gather_key, c * 8), q_src + c * 8, q_valid);
      }
      gather_kv_tile(0, slot_of_tile(0));
      cutlass::arch::cpasync_barrier_arrive_noinc(&full_barrier[0]);  // covers the q tile too
      gather_kv_tile(1, slot_of_tile(1));  // zero-filled when there is no second tile
      cutlass::arch::cpasync_barrier_arrive_noinc(&full_barrier[1]);
      next_slot[0] = slot_of_tile(2);
      next_slot[1] = slot_of_tile(3);
    }
    DDTREE_PHASE(2);

    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    typename Traits::TiledMmaPVShared mma_pv_shared;
    auto thr_qk = mma_qk.get_slice(wg_thread);
    auto thr_pv = mma_pv.get_slice(wg_thread);
    auto thr_pv_shared = mma_pv_shared.get_slice(wg_thread);
    Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
    Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kRows>, Int<kHalf>>{});
    clear(acc_o);
    Tensor coord_s = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{}));
    Tensor coord_o = thr_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kHalf>>{}));
    const int my_row = get<0>(coord_s(0));  // this thread's rows: my_row and my_row + 8
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};  // this thread's columns of this warpgroup's tiles; reduced at the end

    Tensor frag_q = thr_qk.partition_fragment_A(sQ);

    // Pair i holds tiles 2i (stage 0) and 2i + 1 (stage 1; zero-filled and masked past the end).
    // Warpgroup w computes S for tile 2i + w only (no Q K^T is done twice), the two agree on each
    // row's new maximum through shared memory, and each writes its P into its stage's rope block;
    // then each accumulates its 256 output columns over both tiles: P V with its own P from
    // registers, and with the other's P from shared memory. Stage 0's P V runs first so stage 0 is
    // refilled while stage 1's P V runs.
    using cutlass::arch::NamedBarrier;
    constexpr int kExchangeBarrier = 0;
    constexpr int kStageElems = cosize_v<typename Traits::SmemLayoutK>;
    const int num_pairs = (num_tiles + 1) / 2;
    for (int pair = 0; pair < num_pairs; ++pair) {
      const int phase = (pairs_done + pair) & 1;
      const int my_tile = 2 * pair + warpgroup;
      Element* my_stage = smem_k + warpgroup * kStageElems;
      Barrier::wait(&full_barrier[warpgroup], phase);
      if (pair == 0) DDTREE_PHASE(3);
      cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma (async proxy) reads
      Tensor sK = make_tensor(make_smem_ptr(my_stage), typename Traits::SmemLayoutK{});
      issue_warpgroup_gemm<true>(mma_qk, frag_q, thr_qk.partition_fragment_B(sK), acc_s);
      wait_warpgroup_gemm(acc_s);
      if (pair == 0) DDTREE_PHASE(4);

      // Visibility of this tile's 64 columns for the thread's two rows (bit c: column kv0 + c);
      // only tiles that reach the drafts read mask words, two at most per row.
      const int kv0 = kv_begin + my_tile * kKeys;
      uint64_t visible_bits[2] = {~0ull, ~0ull};
      if (kv0 < kv_end && kv0 + kKeys > prefix_len) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int row = row0 + my_row + 8 * j;
          if (row < num_rows) {
            const int64_t* words = p.mask_words + (q_lo + row / p.heads) * p.mask_stride;
            visible_bits[j] = tile_visibility(words, kv0 - prefix_len, num_draft);
          }
        }
      }
      // Scale to base 2, mask, maxima of this tile (each row lives in one quad of lanes).
      float tile_max[2] = {-INFINITY, -INFINITY};
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int col = get<1>(coord_s(i));
        const int which = get<0>(coord_s(i)) == my_row ? 0 : 1;
        const bool visible = kv0 + col < kv_end && ((visible_bits[which] >> col) & 1);
        const float s = visible ? acc_s(i) * p.scale_log2 : -INFINITY;
        acc_s(i) = s;
        tile_max[which] = fmaxf(tile_max[which], s);
      }
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) tile_max[j] = quad_max(tile_max[j]);
      if (wg_thread % 4 == 0) {
        row_exchange[warpgroup * kRows + my_row] = tile_max[0];
        row_exchange[warpgroup * kRows + my_row + 8] = tile_max[1];
      }
      NamedBarrier::arrive_and_wait(kThreads, kExchangeBarrier);  // both tiles' maxima published

      float alpha[2], m_safe[2];
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float other_max = row_exchange[(1 - warpgroup) * kRows + my_row + 8 * j];
        const float m_new = fmaxf(row_max[j], fmaxf(tile_max[j], other_max));
        m_safe[j] = m_new == -INFINITY ? 0.f : m_new;  // a row that saw nothing yet stays at 0
        alpha[j] = exp2f(row_max[j] - m_safe[j]);
        row_max[j] = m_new;
        row_sum[j] *= alpha[j];
      }
      Tensor probs = make_tensor<Element>(acc_s.layout());
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int which = get<0>(coord_s(i)) == my_row ? 0 : 1;
        const float e = exp2f(acc_s(i) - m_safe[which]);
        row_sum[which] += e;
        probs(i) = Element(e);
      }
      // P into this stage's rope block: value 4 b + 2 j (+1) is row my_row + 8 j, columns
      // 8 b + 2 (lane % 4) (+1), one 4-byte store per pair at its swizzled address
      // (p_tile_byte_offset; both checked in tests/layout_check.cu).
      const uint32_t p_base = cute::cast_smem_ptr_to_uint(my_stage + Traits::kRopeOffset);
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        CUTE_UNROLL
        for (int b = 0; b < kKeys / 8; ++b) {
          const int i = 4 * b + 2 * j;
          const uint32_t bits = uint32_t(probs(i).raw()) | (uint32_t(probs(i + 1).raw()) << 16);
          const uint32_t addr = p_base + p_tile_byte_offset(my_row + 8 * j, 8 * b + 2 * (wg_thread % 4));
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(bits) : "memory");
        }
      }
      cutlass::arch::fence_view_async_shared();  // P stores (generic proxy) -> the other's wgmma
      NamedBarrier::arrive_and_wait(kThreads, kExchangeBarrier);  // both P tiles in shared memory
      if (pair == 0) DDTREE_PHASE(5);

      // Rescale O only when some row's maximum moved (rare once the prefix has been seen).
      if (__any_sync(0xffffffff, alpha[0] != 1.f || alpha[1] != 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= alpha[get<0>(coord_o(i)) == my_row ? 0 : 1];
      }

      // The other stage's V: this warpgroup observes its arrival itself (the other warpgroup
      // waited for it before its Q K^T, so this does not block).
      Barrier::wait(&full_barrier[1 - warpgroup], phase);
      cutlass::arch::fence_view_async_shared();

      Tensor frag_p = make_tensor(probs.data(), acc_layout_as_a_operand(probs.layout()));
      warpgroup_fence_operand(frag_p);  // the registers the RS wgmma reads are final here
      CUTE_UNROLL
      for (int stage = 0; stage < Traits::kStages; ++stage) {
        Element* stage_ptr = smem_k + stage * kStageElems;
        Tensor sV = make_tensor(make_smem_ptr(stage_ptr), typename Traits::SmemLayoutV{});
        Tensor sV_half = local_tile(sV, Shape<Int<kHalf>, Int<kKeys>>{}, make_coord(warpgroup, 0));
        if (stage == warpgroup) {
          issue_warpgroup_gemm<false>(mma_pv, frag_p, thr_pv.partition_fragment_B(sV_half), acc_o);
        } else {
          Tensor sP_other = make_tensor(make_smem_ptr(stage_ptr + Traits::kRopeOffset), typename Traits::SmemLayoutP{});
          issue_warpgroup_gemm<false>(mma_pv_shared, thr_pv_shared.partition_fragment_A(sP_other),
                                      thr_pv_shared.partition_fragment_B(sV_half), acc_o);
        }
      }
      // Stage 0's P V done: release it, and once both warpgroups have, refill it for the next pair.
      warpgroup_wait<1>();
      Barrier::arrive(&empty_barrier[0]);
      if (pair + 1 < num_pairs) {
        Barrier::wait(&empty_barrier[0], phase);
        gather_kv_tile(0, next_slot[0]);
        cutlass::arch::cpasync_barrier_arrive_noinc(&full_barrier[0]);
        next_slot[0] = slot_of_tile(2 * pair + 4);
      }
      wait_warpgroup_gemm(acc_o);
      if (pair == 0) DDTREE_PHASE(6);
      // Keep P's registers live and unchanged until here: warpgroup 1's RS GEMM (stage 1) was in
      // flight during the refill above, whose temporaries must not reuse them.
      warpgroup_fence_operand(frag_p);
      Barrier::arrive(&empty_barrier[1]);
      if (pair + 1 < num_pairs) {
        Barrier::wait(&empty_barrier[1], phase);
        gather_kv_tile(1, next_slot[1]);
        cutlass::arch::cpasync_barrier_arrive_noinc(&full_barrier[1]);
        next_slot[1] = slot_of_tile(2 * pair + 5);
      }
    }

    DDTREE_PHASE(7);
    // Each warpgroup summed its own tiles' P (both with the same maxima): add the two per row.
    CUTE_UNROLL
    for (int j = 0; j < 2; ++j) row_sum[j] = quad_sum(row_sum[j]);
    if (wg_thread % 4 == 0) {  // the last reads of row_exchange were before the last P barrier
      row_exchange[warpgroup * kRows + my_row] = row_sum[0];
      row_exchange[warpgroup * kRows + my_row + 8] = row_sum[1];
    }
    NamedBarrier::arrive_and_wait(kThreads, kExchangeBarrier);
    DDTREE_PHASE(8);
    CUTE_UNROLL
    for (int j = 0; j < 2; ++j) row_sum[j] += row_exchange[(1 - warpgroup) * kRows + my_row + 8 * j];

    float lse_row[2], inv_sum[2];
    CUTE_UNROLL
    for (int j = 0; j < 2; ++j) {
      const float total = row_sum[j];
      inv_sum[j] = total > 0.f ? 1.f / total : 0.f;
      lse_row[j] = total > 0.f ? (row_max[j] + log2f(total)) * 0.6931471805599453f : -INFINITY;
    }

    // Epilogue: lse from warpgroup 0's quad leaders, the tile through shared memory.
    const int valid_rows = min(kRows, num_rows - row0);  // only a request's last row block is short
    if (warpgroup == 0 && wg_thread % 4 == 0) {
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int row = row0 + my_row + 8 * j;
        if (row >= num_rows) continue;
        const int64_t t = q_lo + row / p.heads, h = row % p.heads;
        if (part_lse_rows == nullptr) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = lse_row[j];
        else part_lse_rows[row - row0] = lse_row[j];
      }
    }
    if (part_rows != nullptr) {
      store_tile_through_smem<float, kRows, kLatent, kThreads>(
          smem, acc_o, coord_o, my_row, warpgroup * kHalf, inv_sum, valid_rows, tid,
          [&](int r) { return part_rows + int64_t(r) * kLatent; });
    } else {
      store_tile_through_smem<Element, kRows, kLatent, kThreads>(
          smem, acc_o, coord_o, my_row, warpgroup * kHalf, inv_sum, valid_rows, tid, [&](int r) {
            const int row = row0 + r;
            return out + (q_lo + row / p.heads) * p.out_stride_token + (row % p.heads) * p.out_stride_head;
          });
    }
    DDTREE_PHASE(9);
    if constexpr (!kPersistent) {
      break;
    } else {
      pairs_done += (num_tiles + 1) / 2;
      if (!plan_segment(plan_inputs, batch_plan, block, segment + 1, seg)) break;
      __syncthreads();  // the epilogue's reads of shared memory come before the next segment's copies
    }
  }
#ifdef DDTREE_PHASE_CLOCKS
  if (tid == 0 && blockIdx.x == 0 && split % 8 == 0) {
    unsigned long long end_ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end_ns));
    long long d[9];
    for (int i = 0; i < 9; ++i) d[i] = phase_cycles[i + 1] - phase_cycles[i];
    printf("phase_clocks split %d tiles %d start_ns %llu span_ns %llu cycles %lld %lld %lld %lld %lld %lld %lld %lld %lld\n",
           split, num_tiles, start_ns, end_ns - start_ns, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8]);
  }
#endif
}

}  // namespace ddtree::sm90
