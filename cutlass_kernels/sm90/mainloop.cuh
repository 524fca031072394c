// The main loop of one segment (a row block and a range of its keys), in pairs of 64-key tiles:
// tile 2i in stage 0, tile 2i + 1 in stage 1.
//
// Warpgroup w computes S for the tile in stage w (over 576 columns, chunk by chunk as the chunks
// land) and owns output columns [256 w, 256 w + 256). Per pair (the seesaw, softmax.cuh):
//   wg 0: S0; raise max (scale0) -> [scale0 ready]; P0 into stage 0's rope chunk; O_L *= scale0;
//         O_L += P0 V0_L; wait [scale1 ready]; P0 *= scale1 in shared memory where a row's
//         maximum moved -> [P0 ready]; release stage 0 chunks 0-3; O_L *= scale1;
//         wait [P1 ready]; O_L += P1 V1_L; release stage 1 chunks 0-3.
//   wg 1: S1 (chunks 4-8 first); wait [scale0 ready]; raise max (scale1) -> [scale1 ready]; P1
//         into its own tile -> [P1 ready]; O_R *= scale0 scale1; O_R += P1 V1_R; wait [P0 ready];
//         O_R += P0 V0_R; release stage 1 chunks 4-8 (as P1 V1_R retires), then stage 0 chunks 4-8.
// So each stage's first half is refilled while the pair runs and only its second half at the
// pair's end, and each next S starts on the half that came first (gather.cuh loads in that order).
// P is stored from the registers the P V GEMM reads before that GEMM is issued: reading them
// while it is in flight makes ptxas serialise its wgmma instructions (warning C7519).
// The four named barriers are each crossed once per pair, and each warpgroup's next arrival on
// one depends on the other's wait on it, so none is overtaken.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "gather.cuh"  // read_key_slots
#include "fp8_tile.cuh"
#include "mask_policy.cuh"
#include "numeric.cuh"  // unpack_pair, pack_pair
#include "softmax.cuh"
#include "traits.cuh"
#include "wait_clocks.cuh"

namespace ddtree::sm90 {

using namespace cute;

// kWidened0 + w: warpgroup w's own barrier, its threads' widened FP8 pieces before its GEMM reads them.
enum PairBarrier : uint32_t { kEpilogueBarrier = 0, kScale0Ready = 1, kScale1Ready = 2, kP0Ready = 3, kP1Ready = 4, kWidened0 = 5 };

// Issues a warpgroup GEMM over all k-blocks (acc += A B) as one commit group; the caller waits.
template <class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void issue_warpgroup_gemm(TiledMma& mma, TA const& a, TB const& b, TC& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
  warpgroup_commit_batch();
}

// S = Q K^T of one stage over the chunks in `Chunks`, in that order: the chunks of one release
// group are waited for together, then one proxy fence (MEMBAR + FENCE.VIEW.ASYNC) makes them
// visible to the tensor cores, and their GEMMs issue while the next group may still be landing.
// kWiden: the group has landed as e4m3 (fp8_tile.cuh); the warpgroup widens it first (the second
// group while the GEMMs over the first run), then syncs on its own barrier.
template <int... kChunk>
struct ChunkGroup {};

template <class Traits, bool kWiden, class TiledMma, class FragQ, class FragK, class AccS, int... kChunk>
__device__ __forceinline__ void qk_gemm_group(TiledMma& mma, FragQ const& frag_q, FragK const& frag_k, uint64_t* chunk_full,
                                              int phase, AccS& acc_s, ChunkGroup<kChunk...>, const WaitClock& clock,
                                              int landed_event, uint32_t stage, int wg_thread, uint32_t widened_barrier) {
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kSteps = Traits::kChunkCols / 16;
  const long long waited = clock.now();
  (Barrier::wait(&chunk_full[kChunk], phase), ...);
  clock.add(kLoadWait, waited);
  clock.mark(landed_event);
  if constexpr (kWiden) {
    constexpr int kChunks[] = {kChunk...};
    constexpr int kFirst = kChunks[0], kLast = kChunks[sizeof...(kChunk) - 1] + 1;
    static_assert(kLast - kFirst == sizeof...(kChunk), "a group is a range of chunks");
    Fp8TileThread<Traits>(wg_thread).template widen<kFirst, kLast>(stage);
  }
  cutlass::arch::fence_view_async_shared();  // cp.async (or the widening's) writes -> wgmma (async proxy) reads
  if constexpr (kWiden) cutlass::arch::NamedBarrier::sync(128, widened_barrier);
  warpgroup_arrive();
  auto chunk_gemm = [&](int c) {
    CUTE_UNROLL
    for (int k = c * kSteps; k < (c + 1) * kSteps; ++k) {
      cute::gemm(mma, frag_q(_, _, k), frag_k(_, _, k), acc_s);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
  };
  (chunk_gemm(kChunk), ...);
  warpgroup_commit_batch();
}

// kWiden: an e4m3 tile, which the warpgroup widens group by group.
template <class Traits, bool kWiden, class TiledMma, class FragQ, class FragK, class AccS, class First, class Second>
__device__ __forceinline__ void qk_gemm(TiledMma& mma, FragQ const& frag_q, FragK const& frag_k, uint64_t* chunk_full, int phase,
                                        AccS& acc_s, First first, Second second, const WaitClock& clock, uint32_t stage,
                                        int wg_thread, uint32_t widened_barrier) {
  warpgroup_fence_operand(acc_s);
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  qk_gemm_group<Traits, kWiden>(mma, frag_q, frag_k, chunk_full, phase, acc_s, first, clock, kTraceFirstGroup, stage,
                                wg_thread, widened_barrier);
  qk_gemm_group<Traits, kWiden>(mma, frag_q, frag_k, chunk_full, phase, acc_s, second, clock, kTraceSecondGroup, stage,
                                wg_thread, widened_barrier);
  const long long issued = clock.now();
  warpgroup_wait<0>();
  clock.add(kSGemmWait, issued);
  clock.mark(kTraceSDone);
  warpgroup_fence_operand(acc_s);
}

// P (value 4 b + 2 j (+1): row my_row + 8 j, columns 8 b + 2 quad_lane (+1)) into
// a P tile (Traits::SmemLayoutP). That is the register layout of an 8 x 8 stmatrix fragment (lane t: row
// t / 4, columns 2 (t % 4) and + 1) for the block (rows 8 j, columns 8 b) of this warp's 16 rows,
// so four stmatrix.x4 store a warp's 16 blocks; lane t gives the address of row t % 8 of block
// t / 8 of each x4 (j = (t / 8) % 2, the column block b + t / 16). Values i and i + 1 (i even)
// are the 32-bit word i / 2 of the compact fragment (softmax.cuh, exponentiate).
template <class Traits, class Probs>
__device__ __forceinline__ void store_probs(typename Traits::Element* p_tile, Probs const& probs, int wg_thread) {
  const uint32_t* const words = reinterpret_cast<const uint32_t*>(probs.data());
  const uint32_t base = cute::cast_smem_ptr_to_uint(p_tile);
  const int lane = wg_thread % 32;
  const int row = 16 * (wg_thread / 32) + 8 * ((lane / 8) % 2) + lane % 8;
  CUTE_UNROLL
  for (int b = 0; b < Traits::kKeys / 8; b += 2) {
    uint32_t bits[4];
    CUTE_UNROLL
    for (int m = 0; m < 4; ++m) bits[m] = words[2 * (b + m / 2) + m % 2];  // block (rows 8 (m % 2), columns 8 (b + m / 2))
    const uint32_t addr = base + p_tile_byte_offset(row, 8 * (b + lane / 16));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(bits[0]), "r"(bits[1]),
                 "r"(bits[2]), "r"(bits[3])
                 : "memory");
  }
  cutlass::arch::fence_view_async_shared();  // P stores (generic proxy) -> the other's wgmma
}

// This warp's 16 rows of a P tile times each row's factor (the warp's lanes take the rows' 128
// 16-byte pieces four each; the warp stored those rows with store_probs).
template <class Traits>
__device__ __forceinline__ void scale_prob_rows(typename Traits::Element* p_tile, const float* row_factor, int wg_thread) {
  using Element = typename Traits::Element;
  constexpr int kPiecesPerRow = Traits::kKeys * int(sizeof(Element)) / 16;
  __syncwarp();  // the warp's stmatrix stores before its lanes read each other's pieces
  CUTE_UNROLL
  for (int k = 0; k < 16 * kPiecesPerRow / 32; ++k) {
    const int piece = wg_thread % 32 + 32 * k;
    const int row = 16 * (wg_thread / 32) + piece / kPiecesPerRow;
    const float factor = row_factor[row];
    uint4* const at = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p_tile) +
                                               p_tile_byte_offset(row, (piece % kPiecesPerRow) * 8));
    uint4 v = *at;
    uint32_t* const words = reinterpret_cast<uint32_t*>(&v);
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) {
      const float2 pair = unpack_pair<Element>(words[w]);
      words[w] = pack_pair<Element>(pair.x * factor, pair.y * factor);
    }
    *at = v;
  }
  cutlass::arch::fence_view_async_shared();  // the rescaled P (generic proxy) -> the other's wgmma
}

// What the GEMM warpgroups need of a segment: its key range and which keys each row sees.
struct SegmentKeys {
  int kv_begin, num_tiles;
  TreeMask mask;
  int row0;  // the block's first packed row
  float scale_log2;
};

// One warpgroup's loop over the segment's pairs. acc_o and row_sum (this thread's part of its
// rows' sums over this warpgroup's tiles) are kept under the shared row maximum at the end.
// kFp8Kv: the stages hold e4m3 tiles, which the warpgroup widens (qk_gemm).
template <class Traits, int kWarpgroup, bool kFp8Kv, class AccO>
__device__ __forceinline__ void run_pairs(const SegmentKeys& seg, typename Traits::Element* smem_q,
                                          typename Traits::Element* smem_k, typename Traits::SharedState& st,
                                          int pairs_done, int wg_thread, AccO& acc_o, float (&row_sum)[2]) {
  using Element = typename Traits::Element;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
  using State = typename Traits::SharedState;
  constexpr int kThreads = Traits::kMmaThreads, kKeys = Traits::kKeys, kHalf = Traits::kHalf;
  constexpr int kStageElems = cosize_v<typename Traits::SmemLayoutK>;
  Element* const stage0 = smem_k;
  Element* const stage1 = smem_k + kStageElems;
  Element* const my_stage = kWarpgroup == 0 ? stage0 : stage1;
  const uint32_t my_stage_addr = cute::cast_smem_ptr_to_uint(my_stage);

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  typename Traits::TiledMmaPVShared mma_pv_shared;
  auto thr_qk = mma_qk.get_slice(wg_thread);
  auto thr_pv = mma_pv.get_slice(wg_thread);
  auto thr_pv_shared = mma_pv_shared.get_slice(wg_thread);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Tensor frag_q = thr_qk.partition_fragment_A(sQ);
  Tensor frag_k = thr_qk.partition_fragment_B(make_tensor(make_smem_ptr(my_stage), typename Traits::SmemLayoutK{}));
  auto v_half = [&](Element* stage) {
    Tensor sV = make_tensor(make_smem_ptr(stage), typename Traits::SmemLayoutV{});
    return local_tile(sV, Shape<Int<kHalf>, Int<kKeys>>{}, make_coord(kWarpgroup, 0));
  };
  Tensor frag_v_mine = thr_pv.partition_fragment_B(v_half(my_stage));
  Tensor frag_v_other = thr_pv_shared.partition_fragment_B(v_half(kWarpgroup == 0 ? stage1 : stage0));
  // P0 in stage 0's rope chunk, P1 in its own tile (traits.cuh).
  Element* const p0_tile = stage0 + Traits::kRopeOffset;
  Element* const p1_tile = reinterpret_cast<Element*>(reinterpret_cast<uint8_t*>(smem_q) + Traits::kP1Offset);  // q is at offset 0
  Tensor frag_p_other = thr_pv_shared.partition_fragment_A(
      make_tensor(make_smem_ptr(kWarpgroup == 0 ? p1_tile : p0_tile), typename Traits::SmemLayoutP{}));

  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<Traits::kRows>, Int<kKeys>>{});
  Tensor probs = make_tensor<Element>(acc_s.layout());
  Tensor frag_p = make_tensor(probs.data(), acc_layout_as_a_operand(probs.layout()));
  const int quad_lane = wg_thread % 4;
  const int my_row = (wg_thread / 32) * 16 + (wg_thread % 32) / 4;  // and my_row + 8 (tests/layout_check.cu)
  const int num_pairs = (seg.num_tiles + 1) / 2;
  const WaitClock clock = wait_clock(st, kWarpgroup, wg_thread);
  // A named barrier wait of the seesaw, its cycles counted as waiting for the partner.
  auto sync_partner = [&](uint32_t barrier) {
    const long long waited = clock.now();
    NamedBarrier::sync(kThreads, barrier);
    clock.add(kPartnerWait, waited);
  };
  // warpgroup_wait<N> after a P V GEMM, its cycles counted.
  auto wait_pv = [&](auto n) {
    const long long waited = clock.now();
    warpgroup_wait<decltype(n)::value>();
    clock.add(kPvGemmWait, waited);
  };

  for (int pair = 0; pair < num_pairs; ++pair) {
    const long long pair_start = clock.now();
    const int global_pair = pairs_done + pair;
    const int phase = global_pair & 1;
    const int kv0 = seg.kv_begin + (2 * pair + kWarpgroup) * kKeys;
    const WaitClock pair_clock = clock.at_pair(global_pair, false);
    pair_clock.mark(kTracePairStart);
    // Each stage's chunks in the order the gather refills them (gather.cuh).
    if constexpr (kWarpgroup == 0) {
      qk_gemm<Traits, kFp8Kv>(mma_qk, frag_q, frag_k, st.chunk_full[0], phase, acc_s, ChunkGroup<0, 1, 2, 3>{},
                                ChunkGroup<4, 5, 6, 7, 8>{}, pair_clock, my_stage_addr, wg_thread, kWidened0);
    } else {
      qk_gemm<Traits, kFp8Kv>(mma_qk, frag_q, frag_k, st.chunk_full[1], phase, acc_s, ChunkGroup<4, 5, 6, 7, 8>{},
                                ChunkGroup<0, 1, 2, 3>{}, pair_clock, my_stage_addr, wg_thread, kWidened0 + 1);
    }

    float tile_max[2], part_sum[2], safe_max[2], factor[2];
    uint64_t visible[2];
    if constexpr (kWarpgroup == 0) {
      seg.mask.tile_bits(kv0, seg.row0, my_row, read_key_slots(st.key_slots[phase][0]), visible);
      mask_and_row_max(acc_s, visible, seg.scale_log2, quad_lane, tile_max);
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const RowUpdate u = raise_row_max(st.row_max[my_row + 8 * j], tile_max[j]);
        safe_max[j] = u.safe_max;
        factor[j] = u.scale;
        tile_max[j] = u.max;
      }
      __syncwarp();  // the quad's reads of row_max before its leader's write
      if (quad_lane == 0) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          st.row_max[my_row + 8 * j] = tile_max[j];
          st.scale0[my_row + 8 * j] = factor[j];
        }
      }
      NamedBarrier::arrive(kThreads, kScale0Ready);
      pair_clock.mark(kTraceScale);
      exponentiate(acc_s, probs, safe_max, part_sum);
      // P0 stored before P0 V0_L, so nothing reads P's registers while the GEMM that reads them
      // is in flight; under m0 until scale1 is known.
      store_probs<Traits>(p0_tile, probs, wg_thread);
      pair_clock.mark(kTracePStored);
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) row_sum[j] = row_sum[j] * factor[j] + part_sum[j];
      rescale_rows(acc_o, factor);
      issue_warpgroup_gemm(mma_pv, frag_p, frag_v_mine, acc_o);
      pair_clock.mark(kTraceFirstPv);
      sync_partner(kScale1Ready);
      pair_clock.mark(kTracePartner);
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        factor[j] = st.scale1[my_row + 8 * j];
        row_sum[j] *= factor[j];
      }
      // Warpgroup 1 takes P0 under m1 (after its P1 V1_R): rare once the maxima settle (softmax.cuh).
      if (__any_sync(0xffffffff, factor[0] != 1.f || factor[1] != 1.f)) scale_prob_rows<Traits>(p0_tile, st.scale1, wg_thread);
      NamedBarrier::arrive(kThreads, kP0Ready);
      wait_pv(Int<0>{});
      warpgroup_fence_operand(frag_p);
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&st.chunk_empty[State::kStage0Low]);
      pair_clock.mark(kTraceFirstRelease);
      rescale_rows(acc_o, factor);
      sync_partner(kP1Ready);
      issue_warpgroup_gemm(mma_pv_shared, frag_p_other, frag_v_other, acc_o);
      pair_clock.mark(kTraceSecondPv);
      wait_pv(Int<0>{});
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&st.chunk_empty[State::kStage1Low]);
      pair_clock.mark(kTraceSecondRelease);
    } else {
      seg.mask.tile_bits(kv0, seg.row0, my_row, read_key_slots(st.key_slots[phase][1]), visible);
      mask_and_row_max(acc_s, visible, seg.scale_log2, quad_lane, tile_max);
      sync_partner(kScale0Ready);
      float scale0[2];
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        scale0[j] = st.scale0[my_row + 8 * j];
        const RowUpdate u = raise_row_max(st.row_max[my_row + 8 * j], tile_max[j]);
        safe_max[j] = u.safe_max;
        factor[j] = u.scale;
        tile_max[j] = u.max;
      }
      __syncwarp();
      if (quad_lane == 0) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          st.row_max[my_row + 8 * j] = tile_max[j];
          st.scale1[my_row + 8 * j] = factor[j];
        }
      }
      NamedBarrier::arrive(kThreads, kScale1Ready);
      pair_clock.mark(kTraceScale);
      exponentiate(acc_s, probs, safe_max, part_sum);
      store_probs<Traits>(p1_tile, probs, wg_thread);
      NamedBarrier::arrive(kThreads, kP1Ready);
      pair_clock.mark(kTracePStored);
      // O_R to m1 at once: P1, and P0 as warpgroup 0 leaves it, are both under m1.
      float to_m1[2];
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        to_m1[j] = scale0[j] * factor[j];
        row_sum[j] = row_sum[j] * to_m1[j] + part_sum[j];
      }
      rescale_rows(acc_o, to_m1);
      issue_warpgroup_gemm(mma_pv, frag_p, frag_v_mine, acc_o);
      pair_clock.mark(kTraceFirstPv);
      sync_partner(kP0Ready);
      pair_clock.mark(kTracePartner);
      issue_warpgroup_gemm(mma_pv_shared, frag_p_other, frag_v_other, acc_o);
      pair_clock.mark(kTraceSecondPv);
      wait_pv(Int<1>{});
      warpgroup_fence_operand(frag_p);
      Barrier::arrive(&st.chunk_empty[State::kStage1High]);
      pair_clock.mark(kTraceFirstRelease);
      wait_pv(Int<0>{});
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&st.chunk_empty[State::kStage0High]);
      pair_clock.mark(kTraceSecondRelease);
    }
    clock.add(kPairCycles, pair_start);
    clock.count(kPairs);
  }
}

}  // namespace ddtree::sm90
