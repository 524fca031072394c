// The gather warpgroup of the transposed e4m3 kernel (verify_attention_transposed.cuh): the piece's
// 64-key tiles of 576-byte e4m3 rows by slot, a bulk copy (TMA) a row into the stages, and each
// tile's keys that have a slot as bits.
#pragma once

#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "cta_timeline.cuh"
#include "transposed_clocks.cuh"
#include "transposed_operands.cuh"
#include "transposed_q.cuh"
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

// The gather threads that copy: one key of a tile each (lanes 0-15 of the four warps).
constexpr int kTransposedCopyThreads = 64;

// First the block's q rows into the last stages (issue_q_rows), then the piece's tiles into the
// stages (tile i into stage i % kStages, after both GEMM warpgroups released its previous tile;
// past the first T::kEarlyTiles, after they have staged q), one bulk copy a key: lane l < 16 of
// warp w copies key 16 w + l of each tile, whose slot id lanes l and l + 16 hold, loaded a tile
// ahead in one of two registers that even and odd tiles swap. A key without a slot (-1 past the
// piece's keys) gets a row of zeros and its bit is clear. The GEMMs take whole pairs, at least
// one: a piece of an odd number of tiles (or of none) gets empty ones, whose keys are all without
// a slot.
template <int N, class Element>
__device__ __forceinline__ void transposed_gather(const TransposedGatherPlan& plan, const TransposedQ<Element>& q_block,
                                                  typename TransposedTraits<N>::State& st, TransposedBarriers& bars,
                                                  uint32_t smem, int t) {
  using T = TransposedTraits<N>;
  constexpr uint32_t kRowBytes = T::kRowBytes;
  const int lane = t % 32, warp = t / 32, key = 16 * warp + lane % 16;
  const int tiles = transposed_pairs_of(plan.num_tiles) * 2;
  auto load_slot = [&](int tile) {
    const int at = plan.kv_begin + tile * T::kKeys + key;
    return at < plan.kv_end ? plan.slots[at] : -1;
  };
  if (lane < 16) issue_q_rows<N>(q_block, smem + T::kQRowsOffset, &bars.q_rows, key);
  stamp_cta_phase(kCtaQIssued, T::kMmaThreads);  // the gather's first thread
  const TransposedClock clock = transposed_clock(st, 2, t == 0);
  auto wait_for_q = [&] {
    const unsigned since = clock.now();
    cutlass::arch::NamedBarrier::sync(T::kThreads, kQStaged);
    clock.add(kQStagedWait, since);
  };
  auto issue_tile = [&](int tile, int slot, int& next) {
    next = tile + 1 < tiles ? load_slot(tile + 1) : -1;  // in flight across the wait below
    if (tile == T::kEarlyTiles) wait_for_q();
    const int stage = tile % T::kStages;
    clock.tick();
    const unsigned since = clock.now();
    if (tile >= T::kStages) cutlass::arch::ClusterBarrier::wait(&bars.empty[stage], (tile / T::kStages - 1) & 1);
    clock.add(kStageRelease, since);
    const uint32_t bits = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
    if (lane == 0) st.key_bits[stage][warp] = static_cast<uint16_t>(bits);  // before lane 0 arrives
    if (lane >= 16) return;
    const uint32_t row = smem + T::kStagesOffset + stage * T::kStageBytes + stage_key_byte(key);
    if (slot >= 0) {
      arrive_expecting(&bars.full[stage], kRowBytes);
      bulk_copy(row, plan.kv + int64_t(slot) * plan.kv_row_bytes, kRowBytes, &bars.full[stage]);
    } else {
      // Zeros, so that O^T's zero probabilities meet finite values; ordered before the bulk copy
      // that next writes the row (another proxy).
#pragma unroll
      for (uint32_t b = 0; b < kRowBytes; b += 16) {
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(row + b), "r"(0) : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      cutlass::arch::ClusterBarrier::arrive(&bars.full[stage]);
    }
  };
  int even = load_slot(0), odd;
  for (int tile = 0; tile < tiles; tile += 2) {
    issue_tile(tile, even, odd);
    issue_tile(tile + 1, odd, even);
  }
  if (tiles <= T::kEarlyTiles) wait_for_q();  // the GEMM warpgroups arrive once in any case
  clock.store(2, N);
}

}  // namespace ddtree::sm90
