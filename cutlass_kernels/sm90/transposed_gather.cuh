// The gather warpgroup of the transposed e4m3 kernel (verify_attention_transposed.cuh): the piece's
// 64-key tiles of 576-byte e4m3 rows by slot, with 16-byte cp.async into the stages, and each
// tile's keys that have a slot as bits.
#pragma once

#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "transposed_clocks.cuh"
#include "transposed_operands.cuh"
#include "transposed_traits.cuh"

namespace ddtree::sm90 {

// The pairs the GEMM warpgroups take for a piece of num_tiles tiles.
__device__ __forceinline__ int transposed_pairs_of(int num_tiles) { return max(1, (num_tiles + 1) / 2); }

// What the gather needs of the CTA's piece.
struct TransposedGatherPlan {
  const uint8_t* kv;                // the pool's e4m3 rows
  int64_t kv_row_bytes;
  const int32_t* slots;             // the request's keys; < 0: no slot
  int kv_begin, kv_end, num_tiles;  // the piece's keys, [kv_begin, kv_end) of the request's
};

// The piece's tiles into the stages (tile i into stage i % kStages, after both GEMM warpgroups
// released its previous tile). Lane l of warp w holds the slot id of the tile's key 16 w + l % 16
// (-1 past the piece's keys), loaded a tile ahead, in one of two registers that even and odd
// tiles swap; the copies get their ids by shuffle, so no copy waits for an id's load. A key
// without a slot is copied as zeros and its bit is clear. The GEMMs take whole pairs, at least
// one: a piece of an odd number of tiles (or of none) gets empty ones, whose keys are all
// without a slot.
template <int N>
__device__ __forceinline__ void transposed_gather(const TransposedGatherPlan& plan, typename TransposedTraits<N>::State& st,
                                                  TransposedBarriers& bars, uint32_t smem, int t) {
  using T = TransposedTraits<N>;
  constexpr int kRowBytes = T::kRowBytes;
  const int lane = t % 32, warp = t / 32;
  const int tiles = transposed_pairs_of(plan.num_tiles) * 2;
  auto load_slot = [&](int tile) {
    const int key = plan.kv_begin + tile * T::kKeys + 16 * warp + lane % 16;
    return key < plan.kv_end ? plan.slots[key] : -1;
  };
  const TransposedClock clock = transposed_clock(st, 2, t == 0);
  auto issue_tile = [&](int tile, int now, int& next) {
    next = tile + 1 < tiles ? load_slot(tile + 1) : -1;
    const int stage = tile % T::kStages;
    clock.tick();
    const unsigned since = clock.now();
    if (tile >= T::kStages) cutlass::arch::ClusterBarrier::wait(&bars.empty[stage], (tile / T::kStages - 1) & 1);
    clock.add(kStageRelease, since);
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
  for (int tile = 0; tile < tiles; tile += 2) {
    issue_tile(tile, even, odd);
    issue_tile(tile + 1, odd, even);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
  clock.store(2, N);
}

}  // namespace ddtree::sm90
