// The operands of FP8 tensor-core GEMMs on an e4m3 KV tile (the FP8-compute design of
// docs/kernel-log.md, 2026-12-05): FP8 wgmma reads both operands K-major, so
//   S = Q K^T:  A = q (hi and lo e4m3 parts, 64 x 576), B = the landed KV tile (64 keys x 576);
//   O += P V:   A = P (hi and lo parts; registers or shared memory), B = V^T (512 x 64 keys),
// every shared tile in the 64-byte swizzle (9 chunks of 64 columns for the 576-wide rows).
// V^T is the tile's first 512 columns transposed, with the keys of each 32-key block in the
// order kSlotKey, the order in which the S accumulator's registers reach the A operand of an
// FP8 P V GEMM: so P needs no exchange between threads, only a pick of its own registers
// (p_register_of) before the e4m3 packing. tests/fp8_operands_check.cu checks all of it on the
// host against CuTe and an emulation of ldmatrix / stmatrix.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace ddtree::sm90 {

// Byte offset of element (row, col) in a K-major e4m3 tile of 64-column chunks (CuTe's
// GMMA::Layout_K_SW64_Atom tiled to rows x cols): chunks of rows x 64 bytes, 8-row atoms of 512
// bytes, 16-byte units XOR (row % 8) / 2.
template <int kRows>
__host__ __device__ constexpr uint32_t sw64_byte_offset(int row, int col) {
  return uint32_t((col / 64) * (kRows * 64) + (row / 8) * 512 + (row % 8) * 64 + ((((col % 64) / 16) ^ ((row % 8) / 2)) * 16) +
                  col % 16);
}

// Key of slot s of a 32-key block: slots 4 q .. 4 q + 3 hold keys 2 q, 2 q + 1, 8 + 2 q, 9 + 2 q
// (the keys thread q of a quad holds in the S accumulator's first two column blocks), slots
// 16 + 4 q .. the same plus 16.
__host__ __device__ constexpr int slot_key(int slot) {
  const int half = slot / 16, q = (slot % 16) / 4, i = slot % 4;
  return 16 * half + 8 * (i / 2) + 2 * q + i % 2;
}

// S accumulator register (value index, compact fragment: value 4 b + 2 j + e is row r0 + 8 j,
// key 8 b + 2 (lane % 4) + e) that value v of FP8 A-operand register `reg` takes: register
// 4 kb + 2 h + j (k-block kb of 32 keys, slot half h, row r0 + 8 j) packs the four values at
// slots 16 h + 4 (lane % 4) + v of its k-block.
__host__ __device__ constexpr int p_register_of(int reg, int v) {
  const int kb = reg / 4, h = (reg / 2) % 2, j = reg % 2;
  return 16 * kb + 8 * h + 4 * (v / 2) + 2 * j + v % 2;
}

// The V^T transpose of one warp step: 32 keys (one block) x 16 columns of V, through one
// ldmatrix.trans.x4 (matrix m: keys 8 m .. 8 m + 7 of the block, 16 columns as 8 column pairs)
// and one stmatrix.x4 (matrix m: V^T rows n0 + 2 i + (m % 2), i = 0..7, slots 16 (m / 2) .. + 15).
// Lane l gives the address of row l % 8 of matrix l / 8 to both.
struct TransposeLane {
  int load_key;   // key (in the block) whose 16 columns lane l addresses for ldmatrix
  int store_row;  // V^T row (from n0) lane l addresses for stmatrix
  int store_slot; // first of the 16 slots there
};
__host__ __device__ constexpr TransposeLane transpose_lane(int lane) {
  const int m = lane / 8, r = lane % 8;
  return TransposeLane{8 * m + r, 2 * r + m % 2, 16 * (m / 2)};
}
// After the ldmatrix, register m of lane l holds keys 8 m + 2 q and + 1 (q = l % 4), each as the
// byte pair of columns n0 + 2 (l / 4) and + 1. Register m of the stmatrix takes V^T row
// n0 + 2 (l / 4) + (m % 2), slots 16 (m / 2) + 4 q .. + 3: these byte selections (__byte_perm of
// loaded registers 2 (m / 2) and 2 (m / 2) + 1).
__host__ __device__ constexpr uint32_t transpose_selector(int m) { return m % 2 ? 0x7531u : 0x6420u; }

// One warp's step of the transpose: keys [32 block, + 32) x columns [n0, n0 + 16) of the e4m3 KV
// tile at shared address `tile` into V^T at `vt`; n0 a multiple of 16.
__device__ __forceinline__ void transpose_v_step(uint32_t tile, uint32_t vt, int block, int n0, int lane) {
  const TransposeLane l = transpose_lane(lane);
  uint32_t r[4], w[4];
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(tile + sw64_byte_offset<64>(32 * block + l.load_key, n0)));
#pragma unroll
  for (int m = 0; m < 4; ++m) w[m] = __byte_perm(r[2 * (m / 2)], r[2 * (m / 2) + 1], transpose_selector(m));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   vt + sw64_byte_offset<512>(n0 + l.store_row, 32 * block + l.store_slot)),
               "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// Two floats as e4m3 (rounded, saturated to +-448), `lo` in the low byte.
__device__ __forceinline__ uint16_t e4m3x2_of(float lo, float hi) {
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  return out;
}
// The two values of e4m3x2_of's result as floats.
__device__ __forceinline__ float2 float2_of_e4m3x2(uint16_t pair) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
  return __half22float2(*reinterpret_cast<const __half2*>(&halves));
}

// P (the S accumulator's exponentials, compact fragment of 32 values) as the registers of an FP8
// P V GEMM's A operand, in two e4m3 parts whose sum is P to ~2^-8: hi = e4m3(P), lo =
// e4m3(P - hi); register i of each takes values p_register_of(i, 0..3).
template <class Probs>
__device__ __forceinline__ void p_as_e4m3_operands(const Probs& p, uint32_t (&hi)[8], uint32_t (&lo)[8]) {
#pragma unroll
  for (int reg = 0; reg < 8; ++reg) {
    uint32_t hi_word = 0, lo_word = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float a = p(p_register_of(reg, 2 * half)), b = p(p_register_of(reg, 2 * half + 1));
      const uint16_t h = e4m3x2_of(a, b);
      const float2 back = float2_of_e4m3x2(h);
      hi_word |= uint32_t(h) << (16 * half);
      lo_word |= uint32_t(e4m3x2_of(a - back.x, b - back.y)) << (16 * half);
    }
    hi[reg] = hi_word;
    lo[reg] = lo_word;
  }
}

}  // namespace ddtree::sm90
