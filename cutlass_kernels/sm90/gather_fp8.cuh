// The gather of an FP8 e4m3 cache: 576-byte KV rows into the same 128-byte-swizzled 16-bit tiles
// as gather.cuh (the GEMMs run in q's dtype), dequantized in shared memory by the gather
// warpgroup. A thread copies each 16-byte piece (16 e4m3 values) with cp.async into one of the two
// 16-byte units of the tile that will hold those 16 values, waits for its own copies, and
// converts the piece into both units (exact: every e4m3 value is a bf16 and an fp16 value). The
// per-tensor scale is not applied here but to the logits and the output (verify_attention.cuh).
// Warps 0-1 fill stage 0 and warps 2-3 stage 1, each part as soon as it is released, and convert
// it as soon as it lands, so that no part waits behind the other stage's release. Each pair's
// rows are prefetched into L2 a pair ahead (the in-place staging holds only one part in flight
// per stage).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "gather.cuh"
#include "traits.cuh"
#include "wait_clocks.cuh"

namespace ddtree::sm90 {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// This thread's cp.async groups complete, all but the newest kPending.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// e4m3 -> 16-bit conversion with integer operations (the F2FP conversions run at a quarter of
// their rate): an e4m3 byte's magnitude bits, shifted into a 16-bit float's exponent and
// mantissa, give the value times 2^-120 in bf16 (2^-8 in fp16) exactly, subnormals included;
// one multiply by the inverse power of two (exact, subnormals kept: bf16 arithmetic has no
// flush) restores it. kE4m3Rescale: that power.
template <class Element>
struct E4m3Bits;
template <>
struct E4m3Bits<cutlass::bfloat16_t> {
  static constexpr int kShift = 4;                    // magnitude bits 8..14 -> 4..10
  static constexpr uint32_t kMagnitude = 0x07f007f0u;
  static constexpr uint32_t kRescale = 0x7b807b80u;   // bf16x2 (2^120, 2^120)
};
template <>
struct E4m3Bits<cutlass::half_t> {
  static constexpr int kShift = 1;                    // magnitude bits 8..14 -> 7..13
  static constexpr uint32_t kMagnitude = 0x3f803f80u;
  static constexpr uint32_t kRescale = 0x5c005c00u;   // f16x2 (2^8, 2^8)
};

// Bytes b0, b1 of `pair_at_high_bytes` (= b1 << 24 | b0 << 8) as two 16-bit Elements, b0 low.
template <class Element>
__device__ __forceinline__ uint32_t e4m3x2_bits_to(uint32_t pair_at_high_bytes) {
  using Bits = E4m3Bits<Element>;
  const uint32_t scaled = ((pair_at_high_bytes >> Bits::kShift) & Bits::kMagnitude) | (pair_at_high_bytes & 0x80008000u);
  uint32_t value;
  if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(value) : "r"(scaled), "r"(Bits::kRescale));
  } else {
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(value) : "r"(scaled), "r"(Bits::kRescale));
  }
  return value;
}

// Eight e4m3 values (two words, the first value in the low byte) as one 16-byte unit of Element.
template <class Element>
__device__ __forceinline__ uint4 e4m3x8_to(uint32_t lo, uint32_t hi) {
  // __byte_perm selectors: bytes (0, 1) and (2, 3) of a word to the high bytes of its halves.
  return make_uint4(e4m3x2_bits_to<Element>(__byte_perm(lo, 0, 0x1404)), e4m3x2_bits_to<Element>(__byte_perm(lo, 0, 0x3424)),
                    e4m3x2_bits_to<Element>(__byte_perm(hi, 0, 0x1404)), e4m3x2_bits_to<Element>(__byte_perm(hi, 0, 0x3424)));
}

// One gather thread's share of a stage's 64-row FP8 tile (the stage's 64 threads, two warps).
// Warp w of the stage, lane l: rows 32 w + 4 i + l / 8 (i = 0..7); the 8 lanes of a row take its
// 128 columns of two chunks at once: lane piece p = l % 8 copies 16 columns (16 bytes) at 16 (p %
// 4) of chunk 2 s + p / 4, i.e. 128 contiguous bytes a row, four rows a warp instruction. The
// rope chunk (64 columns) takes half the lanes per row: lanes p < 4 rows i = 0, 1, 4, 5, lanes p
// >= 4 rows i = 2, 3, 6, 7. A piece stages in the unit of its half selected by p / 4 (`odd`) and
// the converted halves are stored staged unit first, so that the 8 lanes of a row touch 8
// different bank groups in every shared access.
template <class Traits>
struct Fp8GatherThread {
  using Element = typename Traits::Element;
  static constexpr int kChunkBytes = Traits::kKeys * Traits::kChunkCols * int(sizeof(Element));
  static constexpr int kRopeChunk = Traits::kColumnChunks - 1;
  static constexpr int kRows = 8;  // rows per thread
  static_assert(kRopeChunk == 8 && Traits::kChunkCols == 64, "two chunks of 64 columns make a row's 128 bytes");

  // Few registers (the gather warpgroup has 56): the rest is derived where it is used.
  int src_col;      // the piece's first byte in a row's 128-byte pair of chunks: 64 odd + 16 (p % 4)
  uint32_t staged;  // its staged unit in chunk `odd` of a tile, in row 0 of its rows (i = 0)
  int first_row;

  __device__ __forceinline__ explicit Fp8GatherThread(int stage_thread)
      : src_col(64 * ((stage_thread % 8) / 4) + 16 * (stage_thread % 4)),
        staged(uint32_t(odd() * kChunkBytes) + p_tile_byte_offset((stage_thread / 32) * 32 + (stage_thread % 32) / 8,
                                                                   src_col % 64 + 8 * odd())),
        first_row((stage_thread / 32) * 32 + (stage_thread % 32) / 8) {}

  __device__ __forceinline__ int odd() const { return src_col / 64; }
  __device__ __forceinline__ int row(int i) const { return first_row + 4 * i; }

  // Row i's staged unit relative to row 0's: 4 rows down is 512 bytes and the swizzle's unit XOR 4.
  __device__ __forceinline__ static uint32_t row_unit(uint32_t unit0, int i) {
    return (i / 2) * 1024 + (i % 2 ? (unit0 ^ 64u) + 512 : unit0);
  }

  // Calls f(tile offset of the staged unit, row slot index, byte column) for this thread's pieces
  // in chunks [kFirst, kLast) (kFirst even); the rope's rows depend on `odd`: the index is
  // encoded as -1 - (row index for odd == 0).
  template <int kFirst, int kLast, class F>
  __device__ __forceinline__ void for_each_piece(F&& f) const {
    // Opaque copies: addresses derived from them are made here, not hoisted out of the pair loop
    // and held across it (that spills).
    uint32_t staged = this->staged;
    int src_col = this->src_col;
    asm volatile("mov.b32 %0, %0;" : "+r"(staged));
    asm volatile("mov.b32 %0, %0;" : "+r"(src_col));
    const int odd = src_col / 64;
    CUTE_UNROLL
    for (int pair = kFirst / 2; pair < min(kLast, kRopeChunk) / 2; ++pair) {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) f(pair * 2 * kChunkBytes + row_unit(staged, i), i, pair * 128 + src_col);
    }
    if constexpr (kLast > kRopeChunk) {  // rows i = (k % 2) + 4 (k / 2) + 2 odd, their 16 (p % 4) columns of the rope
      const uint32_t rope = kRopeChunk * kChunkBytes + staged - odd * (kChunkBytes - 1024);
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int i = (k % 2) + 4 * (k / 2);
        f(row_unit(rope, i), -1 - i, kRopeChunk * 64 + src_col % 64);
      }
    }
  }

  // Copies this thread's pieces of chunks [kFirst, kLast) (slot < 0: zeros) as one commit group.
  template <int kFirst, int kLast>
  __device__ __forceinline__ void copy(uint32_t tile, const uint8_t* kv, int64_t kv_stride, const int (&slot)[kRows]) const {
    for_each_piece<kFirst, kLast>([&](uint32_t at, int i, int col) {
      const int s = i >= 0 ? slot[i] : (odd() ? slot[1 - i] : slot[-1 - i]);  // rope: row (-1 - i) + 2 odd
      cp_async_16(tile + at, kv + int64_t(s < 0 ? 0 : s) * kv_stride + col, s >= 0);
    });
    cp_async_commit();
  }

  // Converts this thread's landed pieces of chunks [kFirst, kLast) in place and signals the
  // chunks on chunk_full for the stage's 128 threads' share (after a fence: generic writes -> the
  // GEMMs' async-proxy reads).
  template <int kFirst, int kLast>
  __device__ __forceinline__ void convert(uint32_t tile, uint64_t* chunk_full) const {
    const bool is_odd = odd();
    for_each_piece<kFirst, kLast>([&](uint32_t at, int, int) {
      uint4 raw;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                   : "r"(tile + at));
      // The staged unit takes the piece's half selected by `odd`, the other unit the rest.
      const uint4 mine = e4m3x8_to<Element>(is_odd ? raw.z : raw.x, is_odd ? raw.w : raw.y);
      const uint4 rest = e4m3x8_to<Element>(is_odd ? raw.x : raw.z, is_odd ? raw.y : raw.w);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + at), "r"(mine.x), "r"(mine.y), "r"(mine.z),
                   "r"(mine.w)
                   : "memory");
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"((tile + at) ^ 16u), "r"(rest.x), "r"(rest.y), "r"(rest.z),
                   "r"(rest.w)
                   : "memory");
    });
    cutlass::arch::fence_view_async_shared();
    CUTE_UNROLL
    for (int c = kFirst; c < kLast; ++c) arrive_many(&chunk_full[c], 2);
  }
};

// One stage's share of a segment (the stage's two warps): per pair, its first part as soon as
// it is released (stage 0: chunks 0-3, stage 1: chunks 4-8, released mid-pair), converted as soon
// as it lands, then its second part likewise (released at the pair's end). kStage: 0 or 1.
template <class Traits, int kStage>
__device__ __forceinline__ void gather_stage_fp8(const GatherPlan<Traits, uint8_t>& plan, uint32_t tile,
                                                 typename Traits::SharedState& st, int pairs_done, int stage_thread) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using State = typename Traits::SharedState;
  constexpr int kFirstBegin = kStage == 0 ? 0 : 4, kFirstEnd = kStage == 0 ? 4 : 9;
  constexpr int kSecondBegin = kStage == 0 ? 4 : 0, kSecondEnd = kStage == 0 ? 9 : 4;
  constexpr int kFirstRelease = kStage == 0 ? State::kStage0Low : State::kStage1High;
  constexpr int kSecondRelease = kStage == 0 ? State::kStage0High : State::kStage1Low;
  constexpr int kRows = Fp8GatherThread<Traits>::kRows;
  const Fp8GatherThread<Traits> f(stage_thread);
  uint64_t* const chunk_full = st.chunk_full[kStage];
  const int warp = stage_thread / 32;

  const int num_pairs = (plan.num_tiles + 1) / 2;
  const WaitClock clock = wait_clock(st, Traits::kGatherWarpgroup, kStage * 64 + stage_thread);
  auto wait_release = [&](int group, int released) {
    const long long waited = clock.now();
    Barrier::wait(&st.chunk_empty[group], released);
    clock.add(kLoadWait, waited);
  };
  // Row stage_thread of this stage's tile of a pair into L2 (576 bytes, one bulk prefetch).
  auto prefetch_row = [&](int pair) {
    const int s = plan.slot_of(2 * pair + kStage, stage_thread);
    if (s >= 0) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(plan.kv + int64_t(s) * plan.kv_stride),
                   "n"(Traits::kQkDim));
    }
  };
  int slot[kRows];
  auto load_slots = [&](int pair) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) slot[i] = plan.slot_of(2 * pair + kStage, f.row(i));
  };
  load_slots(0);
  prefetch_row(0);
  for (int pair = 0; pair < num_pairs; ++pair) {
    const long long pair_start = clock.now();
    const int global_pair = pairs_done + pair;
    const int released = (global_pair - 1) & 1;
    const bool wait = pair > 0;

    if (wait) wait_release(kFirstRelease, released);
    uint16_t* const key_bits = st.key_slots[global_pair & 1][kStage];
    const uint16_t bits_low = warp_key_bits(slot), bits_high = warp_key_bits(slot + 4);
    if (stage_thread % 32 == 0) {
      key_bits[2 * warp] = bits_low;
      key_bits[2 * warp + 1] = bits_high;
    }
    f.template copy<kFirstBegin, kFirstEnd>(tile, plan.kv, plan.kv_stride, slot);
    prefetch_row(pair + 1);
    cp_async_wait<0>();
    f.template convert<kFirstBegin, kFirstEnd>(tile, chunk_full);
    if (stage_thread % 32 == 0) arrive_many(&chunk_full[0], 2);  // after this warp's key bits

    if (wait) wait_release(kSecondRelease, released);
    f.template copy<kSecondBegin, kSecondEnd>(tile, plan.kv, plan.kv_stride, slot);
    load_slots(pair + 1);
    cp_async_wait<0>();
    f.template convert<kSecondBegin, kSecondEnd>(tile, chunk_full);
    clock.add(kPairCycles, pair_start);
    clock.count(kPairs);
  }
}

// gather_segment for an FP8 cache: warps 0-1 fill stage 0, warps 2-3 stage 1.
template <class Traits>
__device__ __forceinline__ void gather_segment_fp8(const GatherPlan<Traits, uint8_t>& plan, uint32_t smem_k,
                                                   typename Traits::SharedState& st, int pairs_done, int wg_thread) {
  if (wg_thread < 64) {
    gather_stage_fp8<Traits, 0>(plan, smem_k, st, pairs_done, wg_thread);
  } else {
    gather_stage_fp8<Traits, 1>(plan, smem_k + Traits::kSmemK, st, pairs_done, wg_thread - 64);
  }
}

}  // namespace ddtree::sm90
