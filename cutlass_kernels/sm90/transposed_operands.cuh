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
// tests/transposed_operands_check.cu checks both against CuTe's fragments on the host.
#pragma once

#include <cstdint>

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

}  // namespace ddtree::sm90
