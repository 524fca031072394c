// The gather: 576-wide KV rows (by the gather warpgroup, while the two GEMM warpgroups compute)
// and the q tile (by the GEMM warpgroups, at a segment's start) into 128-byte-swizzled shared
// memory. A tile whose 64 keys have consecutive slots (a page of a paged cache, or a run of
// slots) is loaded by one thread as nine TMA boxes; any other tile by 16-byte cp.async from all
// 128 threads. Each 64-column chunk of a KV tile completes on its own mbarrier (so Q K^T starts
// on the first chunk while the others are in flight), and each part of a stage is refilled as
// soon as its last reader releases it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "fp8_tile.cuh"
#include "traits.cuh"
#include "wait_clocks.cuh"

namespace ddtree::sm90 {

// The gather warpgroup's own hardware barrier (CUTLASS's named barriers start at 8; the GEMM
// warpgroups use 8-12).
constexpr int kGatherBarrier = 15;

// True in all 128 gather threads when `mine` is true in each; one barrier reduction.
__device__ __forceinline__ bool warpgroup_all(bool mine) {
  int all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.and.pred q, %2, 128, p;\n selp.b32 %0, 1, 0, q;\n}\n"
      : "=r"(all)
      : "r"(int(mine)), "n"(kGatherBarrier)
      : "memory");
  return all != 0;
}

// The q tile by the 256 GEMM threads (4 per row), while the gather warpgroup starts on the keys.
template <class Traits>
__device__ __forceinline__ void gather_q(uint32_t smem_q, const typename Traits::Element* q_row, bool valid, int tid,
                                         uint64_t* q_full) {
  constexpr int kPieceElems = 16 / int(sizeof(typename Traits::Element));
  constexpr int kChunkBytes = Traits::kKeys * Traits::kChunkCols * int(sizeof(typename Traits::Element));
  const int row = tid / 4, first = tid % 4;
  const uint32_t row_base = smem_q + (row / 8) * 1024 + (row % 8) * 128;
  CUTE_UNROLL
  for (int k = 0; k < Traits::kQkDim / kPieceElems / 4; ++k) {
    const int piece = first + 4 * k;  // of the row's 72
    const int chunk = piece / 8, in_chunk = piece % 8;
    cp_async_16(row_base + chunk * kChunkBytes + ((in_chunk ^ (row % 8)) * 16), q_row + piece * kPieceElems, valid);
  }
  cutlass::arch::cpasync_barrier_arrive_noinc(q_full);
}

// One gather thread's share of a 64-row, 576-column KV tile (Traits::SmemLayoutK): in warp w,
// lane l copies 16-byte piece l % 8 of rows 16 w + 4 i + l / 8 (i = 0..3) in every 64-column
// chunk, so each warp instruction reads four whole 128-byte lines (four rows of one chunk): the
// fewest L1 requests per byte a row gather can make.
template <class Traits>
struct GatherThread {
  using Element = typename Traits::Element;
  static constexpr int kPieceElems = 16 / int(sizeof(Element));
  static constexpr int kChunkBytes = Traits::kKeys * Traits::kChunkCols * int(sizeof(Element));
  static constexpr int kRowsPerThread = 4;

  int first_row, piece;
  uint32_t row_offset[2];  // the piece's swizzled offset in rows with i even / odd (+1 KB per 2 i)

  __device__ __forceinline__ explicit GatherThread(int wg_thread)
      : first_row((wg_thread / 32) * 16 + (wg_thread % 32) / 8), piece(wg_thread % 8) {
    CUTE_UNROLL
    for (int odd = 0; odd < 2; ++odd) {  // a 64-column chunk has the 64 x 64 layout of traits.cuh
      row_offset[odd] = p_tile_byte_offset(first_row + 4 * odd, piece * kPieceElems);
    }
  }

  __device__ __forceinline__ int row(int i) const { return first_row + 4 * i; }

  // Chunks [kFirst, kLast) of this thread's rows (slot < 0: zero-filled), each chunk's arrival
  // signalled on chunk_full[c].
  template <int kFirst, int kLast>
  __device__ __forceinline__ void copy(uint32_t tile, const Element* kv, int64_t kv_stride, const int (&slot)[4],
                                       uint64_t* chunk_full) const {
    CUTE_UNROLL
    for (int c = kFirst; c < kLast; ++c) {
      CUTE_UNROLL
      for (int i = 0; i < kRowsPerThread; ++i) {
        const Element* src = kv + int64_t(slot[i] < 0 ? 0 : slot[i]) * kv_stride + c * Traits::kChunkCols + piece * kPieceElems;
        cp_async_16(tile + c * kChunkBytes + row_offset[i % 2] + (i / 2) * 1024, src, slot[i] >= 0);
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(&chunk_full[c]);
    }
  }

  // The same chunks of a consecutive tile (rows [first, first + 64) of the pool) as TMA boxes,
  // issued by gather thread 0 for the whole warpgroup: its arrival counts for all 128 threads.
  template <int kFirst, int kLast>
  __device__ __forceinline__ void load_boxes(uint32_t tile, const CUtensorMap* map, int first, uint64_t* chunk_full,
                                             int wg_thread) const {
    if (wg_thread != 0) return;
    CUTE_UNROLL
    for (int c = kFirst; c < kLast; ++c) {
      expect_bytes(&chunk_full[c], kChunkBytes);
      tma_load_box(map, tile + c * kChunkBytes, &chunk_full[c], c * Traits::kChunkCols, first);
      arrive_many(&chunk_full[c], 128);
    }
  }

  template <int kFirst, int kLast>
  __device__ __forceinline__ void load(uint32_t tile, const Element* kv, int64_t kv_stride, const int (&slot)[4],
                                       const CUtensorMap* map, int first, bool boxes, uint64_t* chunk_full,
                                       int wg_thread) const {
    if (boxes) {
      load_boxes<kFirst, kLast>(tile, map, first, chunk_full, wg_thread);
    } else {
      copy<kFirst, kLast>(tile, kv, kv_stride, slot, chunk_full);
    }
  }

  // Which of the tile's 64 keys have a slot (bit k: key k): each warp publishes the 16 bits of
  // its rows (lanes 0, 8, 16, 24 hold rows 16 w + 4 i + 0..3); the reader loads all four at once.
  __device__ __forceinline__ void publish_key_slots(const int (&slot)[4], int wg_thread, uint16_t* key_bits) const {
    uint32_t bits = 0;
    CUTE_UNROLL
    for (int i = 0; i < kRowsPerThread; ++i) {
      const uint32_t b = __ballot_sync(0xffffffff, slot[i] >= 0);
      bits |= ((b & 1u) | ((b >> 7) & 2u) | ((b >> 14) & 4u) | ((b >> 21) & 8u)) << (4 * i);
    }
    if (wg_thread % 32 == 0) key_bits[wg_thread / 32] = static_cast<uint16_t>(bits);
  }

  // True in all 128 gather threads when every row's slot is first + row (the tile is rows
  // [first, first + 64) of the pool); one barrier reduction.
  __device__ __forceinline__ bool all_consecutive(const int (&slot)[4], int first) const {
    bool mine = first >= 0;
    CUTE_UNROLL
    for (int i = 0; i < kRowsPerThread; ++i) mine = mine && slot[i] == first + row(i);
    return warpgroup_all(mine);
  }
};

__device__ __forceinline__ uint64_t read_key_slots(const uint16_t* key_bits) {
  return *reinterpret_cast<const uint64_t*>(key_bits);
}

// What the gather needs of a segment. KvElement: the cache's element (q's, or uint8_t: e4m3 bytes).
template <class Traits, class KvElement = typename Traits::Element>
struct GatherPlan {
  const KvElement* kv;
  int64_t kv_stride;  // elements of KvElement
  const int32_t* slots;  // verify_indices of the request's first key
  const CUtensorMap* kv_map;  // the pool as 64 x 64 boxes, or nullptr: cp.async only
  int kv_begin, kv_end, num_tiles;

  __device__ __forceinline__ int slot_of(int tile, int row) const {  // -1 past the range
    const int key = kv_begin + tile * Traits::kKeys + row;
    return tile < num_tiles && key < kv_end ? slots[key] : -1;
  }
};

// The gather warpgroup's work for one segment: each pair's two tiles, part by part as
// the GEMM warpgroups release the previous pair's (the first pair of a segment starts on empty
// stages). Pair g's key bits go to buffer g % 2, published before chunk 0's barrier completes.
// KvElement uint8_t: an e4m3 cache, copied as it is (fp8_tile.cuh; no TMA boxes).
template <class Traits, class KvElement>
__device__ __forceinline__ void gather_segment(const GatherPlan<Traits, KvElement>& plan, uint32_t smem_k,
                                               typename Traits::SharedState& st, int pairs_done, int wg_thread) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using State = typename Traits::SharedState;
  constexpr bool kFp8 = cute::is_same_v<KvElement, uint8_t>;
  constexpr uint32_t kStageBytes = Traits::kSmemK;
  const GatherThread<Traits> g(wg_thread);
  const uint32_t stage_base[2] = {smem_k, smem_k + kStageBytes};
  const bool warp_leader = wg_thread % 32 == 0;

  const int num_pairs = (plan.num_tiles + 1) / 2;
  const WaitClock clock = wait_clock(st, Traits::kGatherWarpgroup, wg_thread);
  auto wait_release = [&](int group, int released) {  // a part of a stage, from its last reader
    const long long waited = clock.now();
    Barrier::wait(&st.chunk_empty[group], released);
    clock.add(kLoadWait, waited);
  };
  int slot[2][4], first[2];
  auto load_slots = [&](int pair) {  // the pair's slots, loaded while the previous pair lands
    CUTE_UNROLL
    for (int t = 0; t < 2; ++t) {
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) slot[t][i] = plan.slot_of(2 * pair + t, g.row(i));
      first[t] = kFp8 ? -1 : plan.slot_of(2 * pair + t, 0);
    }
  };
  bool boxes[2];
  // Chunks [kFirst, kLast) of the tile in stage t.
  auto load = [&](auto first_chunk, auto last_chunk, int t) {
    constexpr int kFirst = decltype(first_chunk)::value, kLast = decltype(last_chunk)::value;
    if constexpr (kFp8) {
      Fp8TileThread<Traits>(wg_thread).template copy<kFirst, kLast>(stage_base[t], plan.kv, plan.kv_stride, slot[t],
                                                                    st.chunk_full[t]);
    } else {
      g.template load<kFirst, kLast>(stage_base[t], plan.kv, plan.kv_stride, slot[t], plan.kv_map, first[t], boxes[t],
                                     st.chunk_full[t], wg_thread);
    }
  };
  load_slots(0);
  for (int pair = 0; pair < num_pairs; ++pair) {
    const long long pair_start = clock.now();
    const int global_pair = pairs_done + pair;
    const int released = (global_pair - 1) & 1;  // the phase in which the previous pair was released
    const bool wait = pair > 0;
    const WaitClock pair_clock = clock.at_pair(global_pair, true);
    pair_clock.mark(kTracePairStart);
    CUTE_UNROLL
    for (int t = 0; t < 2; ++t) boxes[t] = !kFp8 && plan.kv_map != nullptr && g.all_consecutive(slot[t], first[t]);

    // In the order the parts are released (mainloop.cuh): each stage's first half mid-pair,
    // its second at the pair's end, so that half of each refill overlaps the pair.
    if (wait) wait_release(State::kStage0Low, released);
    pair_clock.mark(kTraceGroup0Acquired);
    g.publish_key_slots(slot[0], wg_thread, st.key_slots[global_pair & 1][0]);
    load(Int<0>{}, Int<4>{}, 0);
    if (warp_leader) Barrier::arrive(&st.chunk_full[0][0]);  // after this warp's key bits
    pair_clock.mark(kTraceGroup0Issued);
    if (wait) wait_release(State::kStage1High, released);
    pair_clock.mark(kTraceGroup1Acquired);
    g.publish_key_slots(slot[1], wg_thread, st.key_slots[global_pair & 1][1]);
    load(Int<4>{}, Int<9>{}, 1);
    if (warp_leader) Barrier::arrive(&st.chunk_full[1][0]);
    pair_clock.mark(kTraceGroup1Issued);
    if (wait) wait_release(State::kStage0High, released);
    pair_clock.mark(kTraceGroup2Acquired);
    load(Int<4>{}, Int<9>{}, 0);
    pair_clock.mark(kTraceGroup2Issued);
    if (wait) wait_release(State::kStage1Low, released);
    pair_clock.mark(kTraceGroup3Acquired);
    load(Int<0>{}, Int<4>{}, 1);
    pair_clock.mark(kTraceGroup3Issued);

    load_slots(pair + 1);
    clock.add(kPairCycles, pair_start);
    clock.count(kPairs);
  }
}

}  // namespace ddtree::sm90
