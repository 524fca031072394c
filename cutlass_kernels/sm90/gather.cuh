// The gather: scattered 576-wide KV rows (by the gather warpgroup, while the two GEMM warpgroups
// compute) and the q tile (by the GEMM warpgroups, at a segment's start) into 128-byte-swizzled
// shared memory with 16-byte cp.async. Each 64-column chunk of
// a KV tile completes on its own mbarrier (so Q K^T starts on the first chunk while the others
// are in flight), and each part of a stage is refilled as soon as its last reader releases it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "traits.cuh"

namespace ddtree::sm90 {

// 16 bytes global -> shared, bypassing L1; the L2 fetches 256 bytes of the 1152-byte row at once.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src, bool valid) {
  const int src_size = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_size));
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

// Which of a tile's 64 keys have a slot (bit k: key k), from the slot each gather thread holds
// (thread t: key t / 2). Each warp publishes its 16 keys; the reader loads all four at once.
__device__ __forceinline__ void publish_key_slots(int slot, int wg_thread, uint16_t* key_bits) {
  uint32_t bits = __ballot_sync(0xffffffff, slot >= 0) & 0x55555555u;  // even lanes: one per key
  bits = (bits | (bits >> 1)) & 0x33333333u;
  bits = (bits | (bits >> 2)) & 0x0f0f0f0fu;
  bits = (bits | (bits >> 4)) & 0x00ff00ffu;
  bits = (bits | (bits >> 8)) & 0x0000ffffu;
  if (wg_thread % 32 == 0) key_bits[wg_thread / 32] = static_cast<uint16_t>(bits);
}

__device__ __forceinline__ uint64_t read_key_slots(const uint16_t* key_bits) {
  return *reinterpret_cast<const uint64_t*>(key_bits);
}

// One gather thread's share of a 64-row, 576-column KV tile (Traits::SmemLayoutK): row t / 2, and 16-byte pieces t % 2, +2, +4, +6 of every 64-column chunk,
// so a warp's instruction reads whole 32-byte sectors. The swizzled byte offsets of the four
// pieces within a chunk are the same for every chunk (chunk c starts at c * 8 KB).
template <class Traits>
struct GatherThread {
  using Element = typename Traits::Element;
  static constexpr int kPieceElems = 16 / int(sizeof(Element));
  static constexpr int kChunkBytes = Traits::kKeys * Traits::kChunkCols * int(sizeof(Element));

  int row, half;
  uint32_t piece_offset[4];

  __device__ __forceinline__ explicit GatherThread(int wg_thread) : row(wg_thread / 2), half(wg_thread % 2) {
    const uint32_t row_base = (row / 8) * 1024 + (row % 8) * 128;  // 8-row atoms of 1 KB, 128 B a row
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) piece_offset[k] = row_base + (((half + 2 * k) ^ (row % 8)) * 16);
  }

  // Chunks [kFirst, kLast) of this thread's row from `src` (zero-filled when !valid), each
  // chunk's arrival signalled on chunk_full[c] (nullptr: none).
  template <int kFirst, int kLast>
  __device__ __forceinline__ void copy(uint32_t tile, const Element* src, bool valid, uint64_t* chunk_full) const {
    CUTE_UNROLL
    for (int c = kFirst; c < kLast; ++c) {
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        cp_async_16(tile + c * kChunkBytes + piece_offset[k], src + c * Traits::kChunkCols + (half + 2 * k) * kPieceElems, valid);
      }
      if (chunk_full != nullptr) cutlass::arch::cpasync_barrier_arrive_noinc(&chunk_full[c]);
    }
  }
};

// What the gather needs of a segment.
template <class Traits>
struct GatherPlan {
  const typename Traits::Element* kv;
  int64_t kv_stride;
  const int32_t* slots;  // verify_indices of the request's first key
  int kv_begin, kv_end, num_tiles;

  __device__ __forceinline__ int slot_of(int tile, int row) const {  // -1 past the range
    const int key = kv_begin + tile * Traits::kKeys + row;
    return tile < num_tiles && key < kv_end ? slots[key] : -1;
  }
};

// The gather warpgroup's work for one segment: each pair's two tiles, part by part as
// the GEMM warpgroups release the previous pair's (the first pair of a segment starts on empty
// stages). Pair g's key bits go to buffer g % 2, published before chunk 0's barrier completes.
template <class Traits>
__device__ __forceinline__ void gather_segment(const GatherPlan<Traits>& plan, uint32_t smem_k,
                                               typename Traits::SharedState& st, int pairs_done, int wg_thread) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using Element = typename Traits::Element;
  using State = typename Traits::SharedState;
  constexpr uint32_t kStageBytes = Traits::kSmemK;
  const GatherThread<Traits> g(wg_thread);
  const uint32_t stage0 = smem_k, stage1 = smem_k + kStageBytes;
  const bool warp_leader = wg_thread % 32 == 0;

  const int num_pairs = (plan.num_tiles + 1) / 2;
  int slot[2] = {plan.slot_of(0, g.row), plan.slot_of(1, g.row)};
  for (int pair = 0; pair < num_pairs; ++pair) {
    const int global_pair = pairs_done + pair;
    const int released = (global_pair - 1) & 1;  // the phase in which the previous pair was released
    const bool wait = pair > 0;
    const Element* src0 = plan.kv + int64_t(slot[0] < 0 ? 0 : slot[0]) * plan.kv_stride;
    const Element* src1 = plan.kv + int64_t(slot[1] < 0 ? 0 : slot[1]) * plan.kv_stride;

    if (wait) Barrier::wait(&st.chunk_empty[State::kStage0Low], released);
    publish_key_slots(slot[0], wg_thread, st.key_slots[global_pair & 1][0]);
    g.template copy<0, 4>(stage0, src0, slot[0] >= 0, st.chunk_full[0]);
    if (warp_leader) Barrier::arrive(&st.chunk_full[0][0]);  // after this warp's key bits
    if (wait) Barrier::wait(&st.chunk_empty[State::kStage0High], released);
    g.template copy<4, 9>(stage0, src0, slot[0] >= 0, st.chunk_full[0]);

    if (wait) Barrier::wait(&st.chunk_empty[State::kStage1Low], released);
    publish_key_slots(slot[1], wg_thread, st.key_slots[global_pair & 1][1]);
    g.template copy<0, 4>(stage1, src1, slot[1] >= 0, st.chunk_full[1]);
    g.template copy<8, 9>(stage1, src1, slot[1] >= 0, st.chunk_full[1]);
    if (warp_leader) Barrier::arrive(&st.chunk_full[1][0]);
    if (wait) Barrier::wait(&st.chunk_empty[State::kStage1High], released);
    g.template copy<4, 8>(stage1, src1, slot[1] >= 0, st.chunk_full[1]);

    slot[0] = plan.slot_of(2 * pair + 2, g.row);  // the next pair's slots, loaded while this one lands
    slot[1] = plan.slot_of(2 * pair + 3, g.row);
  }
}

}  // namespace ddtree::sm90
