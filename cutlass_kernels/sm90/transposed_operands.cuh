// The register operands of the transposed FP8 design (docs/kernel-log.md, twenty-first session:
// the e4m3 tile stays e4m3 in shared memory and is widened into registers, as the A operand):
//   S^T = K Q^T    A = K (64 keys x a 64-column chunk per four k-steps), B = q (the block's rows);
//   O^T = V^T P^T  A = V^T (a warpgroup's 256 output columns x 64 keys), B = P^T (P stored [row][key]).
// Both A operands have the layout of the RS atoms (MMA_64xNx16, A K-major in registers): in k-step
// s, register p of a thread holds row r0 + 8 (p % 2) and k positions 16 s + 8 (p / 2) + 2 q and
// + 1 (q = lane % 4, r0 = 16 warp + lane / 4). Two permutations make each thread's bytes contiguous:
// - q's columns within a 64-column chunk (k_position_of / q_column_at): a thread's 16 values of a
//   chunk are bytes [16 q, 16 q + 16) of each of its two keys, one 16-byte load a key;
// - the output columns of a warpgroup (v_output_column): a thread's values of one key over the four
//   64-row m-blocks are 8 consecutive bytes, one 8-byte load a key, paired across keys by prmt.
// tests/transposed_operands_check.cu checks both, and the addresses below, against CuTe's fragments
// and layouts on the host.
#pragma once

#include <cstdint>

#include "traits.cuh"  // p_tile_byte_offset

namespace ddtree::sm90 {

// S^T: the byte (column within a 64-column chunk of the key row) that register p of k-step s of
// quad lane q takes its two values from (the second is the next byte).
__host__ __device__ constexpr int k_register_byte(int s, int p, int q) { return 16 * q + 4 * s + 2 * (p / 2); }

// S^T: the k position (within the chunk) that q's column `col` must take in q's shared tile, so
// that it meets the key bytes k_register_byte puts there; q_column_at is its inverse.
__host__ __device__ constexpr int k_position_of(int col) {
  const int q = col / 16, s = (col % 16) / 4, half = (col % 4) / 2, e = col % 2;
  return 16 * s + 8 * half + 2 * q + e;
}
__host__ __device__ constexpr int q_column_at(int position) {
  const int s = position / 16, half = (position % 16) / 8, q = (position % 8) / 2, e = position % 2;
  return 16 * q + 4 * s + 2 * half + e;
}

// O^T: the output column (within the warpgroup's 256) of A row r0 + 8 i (i = 0, 1) of m-block bm
// (0..3) for a thread of warp w (0..3) with r = lane / 4: a thread's eight columns are
// [8 (8 w + r), + 8), byte 2 bm + i of its 8-byte load of each key.
__host__ __device__ constexpr int v_output_column(int bm, int w, int r, int i) { return 8 * (8 * w + r) + 2 * bm + i; }

// O^T: the prmt selector that puts byte b (0..3) of key k's word (x) at byte 1 and byte b of key
// k + 1's word (y) at byte 3: the e4m3 pair layout the widening reads (fp8_tile.cuh,
// e4m3x2_bits_to: the other two bytes are masked off there). Register p of m-block bm takes
// byte b = (2 bm + p % 2) % 4 of the words of keys 2 q + 8 (p / 2) and the next.
__host__ __device__ constexpr uint32_t v_pair_selector(int b) { return uint32_t(b << 4 | (4 + b) << 12); }

// q in shared memory (rows x 576, K-major, 128-byte swizzle: S^T's B operand): the byte of row n,
// k position `position` of chunk c. A chunk is rows / 8 atoms of 1 KB, laid out as a P tile.
__host__ __device__ inline uint32_t q_tile_byte_offset(int rows, int n, int c, int position) {
  return uint32_t(c * rows * 128) + p_tile_byte_offset(n, position);
}

// The e4m3 stage: each key's 576 bytes whole (one bulk copy a row), keys k and k + 1 (k even)
// adjacent and each such pair 32 bytes after the last, so that O^T's 8-byte loads of V (a
// half-warp reads four keys two apart: 1184 bytes = 32 mod 128 apart) hit 32 distinct banks, and
// S^T's 16-byte loads of K (keys k, k + 1 a quarter-warp: 576 = 64 mod 128 apart) no bank twice.
__host__ __device__ constexpr int stage_key_byte(int key) { return key * 576 + 32 * (key >> 1); }
constexpr int kTransposedStageBytes = stage_key_byte(64);  // a 64-key tile

// S^T: the stage byte of the 16 bytes of chunk c (0..8) that quad lane q takes from key `key`.
__host__ __device__ constexpr int k_load_byte(int key, int c, int q) { return stage_key_byte(key) + 16 * (4 * c + q); }

// O^T: the byte within a key's row of the 8 bytes that thread (warp w, r = lane / 4) of warpgroup
// wg loads from each key it takes: columns 256 wg + 8 (8 w + r) .. + 7 (v_output_column).
__host__ __device__ constexpr int v_load_column(int wg, int w, int r) { return 256 * wg + 64 * w + 8 * r; }

// The two e4m3 values of a word's half (the first in its low byte) as fp16x2: one instruction,
// exact (every e4m3 value is an fp16 value). The half is picked inside the asm: a 16-bit argument
// made by `word >> 16` costs a shift each.
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t word, int half) {
  uint32_t out;
  if (half == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(out) : "r"(word));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(out) : "r"(word));
  }
  return out;
}

// S^T: K's A fragment of kSteps k-steps from the thread's words of keys r0 (e = 0) and r0 + 8
// (e = 1): word s of key e gives registers 4 s + e (its bytes 0, 1) and 4 s + 2 + e (bytes 2, 3).
template <int kSteps>
__device__ __forceinline__ void widen_k_fragment(const uint32_t (&words)[2][kSteps], uint32_t* a) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      a[4 * s + e] = f16x2_of_e4m3x2(words[e][s], 0);
      a[4 * s + 2 + e] = f16x2_of_e4m3x2(words[e][s], 1);
    }
  }
}

// O^T: V^T's A fragment of one k-step (16 keys) for kBlocks consecutive m-blocks: words[2 h + e]
// are the thread's words of key 16 s + 8 h + 2 q + e (word bm / 2 holds m-blocks bm, bm + 1);
// register 4 bm + p pairs byte (2 bm + p % 2) % 4 of keys e = 0, 1 of h = p / 2.
template <int kBlocks>
__device__ __forceinline__ void widen_v_fragment(const uint32_t (&words)[4][(kBlocks + 1) / 2], uint32_t* a) {
#pragma unroll
  for (int bm = 0; bm < kBlocks; ++bm) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int h = p / 2, b = (2 * bm + p % 2) % 4;
      const uint32_t key0 = words[2 * h][bm / 2], key1 = words[2 * h + 1][bm / 2];
      a[4 * bm + p] = f16x2_of_e4m3x2(__byte_perm(key0, key1, uint32_t(b | (4 + b) << 4)), 0);  // byte b of both keys
    }
  }
}

// P^T from S^T's accumulator by stmatrix.trans: x4 store k (0 .. N / 16 - 1) of warp w writes the
// 8 x 8 blocks (keys 8 (2 w + b % 2) .., rows 8 (2 k + b / 2) ..) for b = 0..3, register b of a
// lane packing its values (c = 0, 1) of accumulator rows my key + 8 (b % 2), block 2 k + b / 2.
// Lane `lane` gives the address of P's row probs_store_row(k, lane), keys from probs_store_key(w, lane).
__host__ __device__ constexpr int probs_store_row(int k, int lane) { return 8 * (2 * k + lane / 16) + lane % 8; }
__host__ __device__ constexpr int probs_store_key(int w, int lane) { return 8 * (2 * w + (lane / 8) % 2); }

}  // namespace ddtree::sm90
