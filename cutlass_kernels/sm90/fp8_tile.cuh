// A 64-row FP8 e4m3 KV tile in the 128-byte-swizzled 16-bit layout of the bf16 tiles
// (traits.cuh; the GEMMs run in q's dtype), widened in place in shared memory. Gather thread i
// copies each of its 16-byte pieces (16 e4m3 values) with cp.async into one of the two 16-byte
// units of the tile that will hold those values, and the pieces complete on the chunks' barriers
// like a bf16 tile's; GEMM thread i of the warpgroup that reads the tile first then widens them
// into both units (exact: every e4m3 value is a bf16 and an fp16 value), under its GEMM over the
// tile's other part (mainloop.cuh). So the gather issues each part as soon as it is released, as
// for a bf16 cache. The per-tensor scale multiplies the logits and the output instead
// (verify_attention.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "traits.cuh"

namespace ddtree::sm90 {

// e4m3 -> 16-bit conversion with integer operations and one multiply (the F2FP conversion chain,
// e4m3x2 -> f16x2 -> f32 -> bf16x2, measured within 5%: kernel log, 2026-12-04): an e4m3 byte's
// magnitude bits, shifted into a 16-bit float's exponent and mantissa, give the value times
// 2^-120 in bf16 (2^-8 in fp16) exactly, subnormals included; one multiply by kRescale, the
// inverse power of two (exact, subnormals kept: bf16 arithmetic has no flush), restores it.
// e4m3's NaN byte (S.1111.111) has no special case: it reads as +-480.
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

// Thread i's pieces of a 64-row FP8 tile (i: its index in the gather warpgroup, which copies
// them, or in the GEMM warpgroup, which widens them). Rows as in GatherThread (warp w, lane l: rows
// 16 w + 4 i + l / 8); the 8 lanes of a row take its 128 columns of two chunks at once: lane
// piece p = l % 8 copies 16 columns (16 bytes) at 16 (p % 4) of chunk 2 s + p / 4, i.e. 128
// contiguous bytes a row, four rows a warp instruction. The rope chunk (64 columns) takes half
// the lanes per row: lanes p < 4 rows i = 0, 1, lanes p >= 4 rows i = 2, 3. A piece stages in
// the unit of its half selected by p / 4 (`odd`) and the converted halves are stored staged unit
// first, so that the 8 lanes of a row touch 8 different bank groups in every shared access.
template <class Traits>
struct Fp8TileThread {
  using Element = typename Traits::Element;
  static constexpr int kChunkBytes = Traits::kKeys * Traits::kChunkCols * int(sizeof(Element));
  static constexpr int kRopeChunk = Traits::kColumnChunks - 1;
  static_assert(kRopeChunk == 8 && Traits::kChunkCols == 64, "two chunks of 64 columns make a row's 128 bytes");

  // Few registers (the gather warpgroup has 56): the rest is derived where it is used.
  int src_col;     // the piece's first byte in a row's 128-byte pair of chunks: 64 odd + 16 (p % 4)
  uint32_t staged; // its staged unit in chunk `odd` of a tile, row first_row (the rows' i = 0)

  __device__ __forceinline__ explicit Fp8TileThread(int wg_thread)
      : src_col(64 * ((wg_thread % 8) / 4) + 16 * (wg_thread % 4)),
        staged(uint32_t(odd() * kChunkBytes) + p_tile_byte_offset((wg_thread / 32) * 16 + (wg_thread % 32) / 8, src_col % 64 + 8 * odd())) {}

  __device__ __forceinline__ int odd() const { return src_col / 64; }

  // Row i's staged unit relative to row 0's: 4 rows down is 512 bytes and the swizzle's unit XOR 4.
  __device__ __forceinline__ static uint32_t row_unit(uint32_t unit0, int i) {
    return (i / 2) * 1024 + (i % 2 ? (unit0 ^ 64u) + 512 : unit0);
  }

  // 128-column pairs of chunks in chunks [first, last)
  static constexpr int chunk_pairs(int first, int last) { return ((last < kRopeChunk ? last : kRopeChunk) - first) / 2; }
  // This thread's pieces in chunks [kFirst, kLast) (kFirst even): 4 rows in each 128-column pair
  // of chunks, then 2 rope pieces.
  template <int kFirst, int kLast>
  static constexpr int kPieces = 4 * chunk_pairs(kFirst, kLast) + (kLast > kRopeChunk ? 2 : 0);

  // Piece n's staged unit (tile offset), its row i (rope: encoded -1 - k, the row is k + 2 odd)
  // and byte column; `staged` and `src_col` are the caller's opaque copies of the members.
  template <int kFirst, int kLast, int n>
  __device__ __forceinline__ static void piece(uint32_t staged, int src_col, uint32_t& at, int& i, int& col) {
    constexpr int kPairPieces = 4 * chunk_pairs(kFirst, kLast);
    if constexpr (n < kPairPieces) {
      constexpr int pair = kFirst / 2 + n / 4;
      i = n % 4;
      at = pair * 2 * kChunkBytes + row_unit(staged, n % 4);
      col = pair * 128 + src_col;
    } else {  // rows k + 2 odd, their 16 (p % 4) columns of the rope
      const int odd = src_col / 64;
      const uint32_t rope = kRopeChunk * kChunkBytes + staged - odd * (kChunkBytes - 1024);
      i = -1 - (n - kPairPieces);
      at = row_unit(rope, n - kPairPieces);
      col = kRopeChunk * 64 + src_col % 64;
    }
  }

  // Opaque copies of the members: addresses derived from them are made where they are used, not
  // hoisted out of the pair loop and held across it (that spills).
  __device__ __forceinline__ void opaque_members(uint32_t& staged, int& src_col) const {
    staged = this->staged;
    src_col = this->src_col;
    asm volatile("mov.b32 %0, %0;" : "+r"(staged));
    asm volatile("mov.b32 %0, %0;" : "+r"(src_col));
  }

  // Calls f(tile offset of the staged unit, row i, byte column) for this thread's pieces in chunks
  // [kFirst, kLast).
  template <int kFirst, int kLast, class F>
  __device__ __forceinline__ void for_each_piece(F&& f) const {
    uint32_t staged;
    int src_col;
    opaque_members(staged, src_col);
    cute::for_each(cute::make_int_sequence<kPieces<kFirst, kLast>>{}, [&](auto n) {
      uint32_t at;
      int i, col;
      piece<kFirst, kLast, decltype(n)::value>(staged, src_col, at, i, col);
      f(at, i, col);
    });
  }

  // Copies this thread's pieces of chunks [kFirst, kLast) (slot < 0: zeros), each chunk's barrier
  // completing when they have landed (still e4m3).
  template <int kFirst, int kLast>
  __device__ __forceinline__ void copy(uint32_t tile, const uint8_t* kv, int64_t kv_stride, const int (&slot)[4],
                                       uint64_t* chunk_full) const {
    for_each_piece<kFirst, kLast>([&](uint32_t at, int i, int col) {
      // i < 0: rope row k = -1 - i, i.e. row k + 2 odd
      const int s = i >= 0 ? slot[i] : (odd() ? slot[1 - i] : slot[-1 - i]);
      cp_async_16(tile + at, kv + int64_t(s < 0 ? 0 : s) * kv_stride + col, s >= 0);
    });
    CUTE_UNROLL
    for (int c = kFirst; c < kLast; ++c) cutlass::arch::cpasync_barrier_arrive_noinc(&chunk_full[c]);
  }

  // Widens this thread's landed pieces of chunks [kFirst, kLast) in place; the caller fences and
  // syncs before the GEMM reads them. The loads go in batches of kBatch ahead of their stores, so
  // a batch waits for one load latency.
  template <int kFirst, int kLast>
  __device__ __forceinline__ void widen(uint32_t tile) const {
    constexpr int kCount = kPieces<kFirst, kLast>, kBatch = 2;  // 4: within 1%
    uint32_t staged;
    int src_col;
    opaque_members(staged, src_col);
    const bool is_odd = src_col / 64;
    cute::for_each(cute::make_int_sequence<(kCount + kBatch - 1) / kBatch>{}, [&](auto b) {
      constexpr int kStart = decltype(b)::value * kBatch, kSize = kCount - kStart < kBatch ? kCount - kStart : kBatch;
      uint32_t at[kSize];
      uint4 raw[kSize];
      cute::for_each(cute::make_int_sequence<kSize>{}, [&](auto j) {
        int i, col;
        piece<kFirst, kLast, kStart + decltype(j)::value>(staged, src_col, at[j], i, col);
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(raw[j].x), "=r"(raw[j].y), "=r"(raw[j].z), "=r"(raw[j].w)
                     : "r"(tile + at[j]));
      });
      cute::for_each(cute::make_int_sequence<kSize>{}, [&](auto j) {
        // The staged unit takes the piece's half selected by `odd`, the other unit the rest.
        const uint4 r = raw[j];
        const uint4 mine = e4m3x8_to<Element>(is_odd ? r.z : r.x, is_odd ? r.w : r.y);
        const uint4 rest = e4m3x8_to<Element>(is_odd ? r.x : r.z, is_odd ? r.y : r.w);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + at[j]), "r"(mine.x), "r"(mine.y), "r"(mine.z),
                     "r"(mine.w)
                     : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"((tile + at[j]) ^ 16u), "r"(rest.x), "r"(rest.y),
                     "r"(rest.z), "r"(rest.w)
                     : "memory");
      });
    });
  }
};

}  // namespace ddtree::sm90
