// The operands of FP8 tensor-core GEMMs on an e4m3 KV tile (the FP8-compute design of
// docs/kernel-log.md, 2026-12-05): FP8 wgmma reads both operands K-major, so
//   S = Q K^T:  A = q (hi and lo e4m3 parts, 64 x 576), B = the landed KV tile (64 keys x 576);
//   O += P V:   A = P (hi and lo parts; registers or shared memory), B = V^T (512 x 64 keys),
// every shared tile in the 64-byte swizzle (9 chunks of 64 columns for the 576-wide rows).
// V^T is the tile's first 512 columns transposed, with the keys of each 32-key block in the
// order slot_key, the order in which the S accumulator's registers reach the A operand of an
// FP8 P V GEMM: so P needs no exchange between threads, only a pick of its own registers
// (p_register_of) before the e4m3 packing. tests/fp8_operands_check.cu checks all of it on the
// host against CuTe and an emulation of ldmatrix / stmatrix.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cutlass/arch/barrier.h>

#include "async_copy.cuh"
#include "numeric.cuh"  // unpack_pair

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

// A warpgroup transposes a tile in 64 warp steps, 16 a warp: warp w's step i is key block w / 2,
// columns n0 = 16 (16 (w % 2) + i). Its lane's addresses from three values it keeps:
// load = load_base + 4096 (i / 4) + (load_unit ^ 16 (i % 4)), store = store_base + 1024 i
// (transpose_step_offsets; the check compares them with transpose_lane's).
struct TransposeBases {
  uint32_t load_base, load_unit, store_base;
};
__host__ __device__ constexpr TransposeBases transpose_bases(int warp, int lane) {
  const int m = lane / 8, r = lane % 8, block = warp / 2, row = 2 * r + m % 2;
  return TransposeBases{uint32_t(block * 2048 + (warp % 2) * 16384 + m * 512 + r * 64), uint32_t((r / 2) * 16),
                        uint32_t((warp % 2) * 16384 + (row / 8) * 512 + (row % 8) * 64 + (((2 * block + m / 2) ^ ((row % 8) / 2)) * 16))};
}
__host__ __device__ constexpr uint32_t transpose_load_offset(const TransposeBases& b, int i) {
  return b.load_base + 4096 * (i / 4) + (b.load_unit ^ uint32_t(16 * (i % 4)));
}
__host__ __device__ constexpr uint32_t transpose_store_offset(const TransposeBases& b, int i) { return b.store_base + 1024 * i; }

// Piece n of gather thread `thread` (0..127) of a 64-row e4m3 KV tile: the 16 bytes of row `row`
// from byte column `col`. The pieces of fp8_tile.cuh's copy: in warp w, lane l takes rows
// 16 w + 4 i + l / 8 (i = 0..3), the 8 lanes of a row its 128 contiguous bytes of each pair of
// chunks (pieces n = 4 pair + i); the rope chunk two rows a lane (n = 16 + k: row i = k + 2 (l % 8 / 4)).
// A piece's byte column: src_col = kv_piece_src_col(thread), the thread's column in each 128-byte
// pair of chunks.
__host__ __device__ constexpr int kv_piece_src_col(int thread) { return 64 * ((thread % 8) / 4) + 16 * (thread % 4); }
__host__ __device__ constexpr int kv_piece_col(int src_col, int n) { return n < 16 ? 128 * (n / 4) + src_col : 512 + src_col % 64; }
__host__ __device__ constexpr void kv_piece(int thread, int n, int& row, int& col) {
  const int lane = thread % 32, p = lane % 8, first_row = 16 * (thread / 32) + lane / 8;
  row = n < 16 ? first_row + 4 * (n % 4) : first_row + 4 * (n - 16 + 2 * (p / 4));
  col = kv_piece_col(kv_piece_src_col(thread), n);
}
// The pieces of chunks [first_chunk, last_chunk) (first_chunk even): 4 per pair of chunks, and the
// two rope pieces where the range ends with the rope chunk.
__host__ __device__ constexpr int kv_piece_begin(int first_chunk) { return 2 * first_chunk; }
__host__ __device__ constexpr int kv_piece_end(int last_chunk) { return last_chunk == 9 ? 18 : 2 * last_chunk; }

// The same pieces' tile offsets from two values a thread keeps: piece n < 16 (pair n / 4, row
// i = n % 4) is at base[i % 2] + 8192 (n / 4) + 512 (i / 2); rope piece 16 + k at base[k] + rope,
// rope = 32768 - 3584 (lane % 8 / 4). kv_piece_offset is that sum; the check compares it with
// sw64_byte_offset of kv_piece.
struct KvPieceBases {
  uint32_t base[2];
  uint32_t rope;
};
__host__ __device__ constexpr KvPieceBases kv_piece_bases(int thread) {
  const int lane = thread % 32, p = lane % 8, x = (lane / 8) / 2;
  const uint32_t d0 = uint32_t((p / 4) * 4096 + 2 * (thread / 32) * 512 + (lane / 8) * 64);
  return KvPieceBases{{d0 + uint32_t(((p % 4) ^ x) * 16), d0 + 256 + uint32_t(((p % 4) ^ (x + 2)) * 16)},
                      uint32_t(32768 - 3584 * (p / 4))};
}
__host__ __device__ constexpr uint32_t kv_piece_offset(const KvPieceBases& b, int n) {
  return n < 16 ? b.base[(n % 4) % 2] + 8192 * (n / 4) + 512 * ((n % 4) / 2) : b.base[n - 16] + b.rope;
}

// Where register `reg` of P (rows my_row + 8 j, slots 32 kb + 16 h + 4 quad_lane .. + 3, as in
// p_register_of) goes in a 64 x 64 P tile: base + 512 j + (swizzle ^ 16 (reg / 2)), from the
// row's base and swizzle term (the check compares it with sw64_byte_offset).
struct PTileRow {
  uint32_t base, swizzle;
};
__host__ __device__ constexpr PTileRow p_tile_row(int my_row, int quad_lane) {
  return PTileRow{uint32_t((my_row / 8) * 512 + (my_row % 8) * 64 + 4 * quad_lane), uint32_t(((my_row % 8) / 2) * 16)};
}
__host__ __device__ constexpr uint32_t p_tile_offset(const PTileRow& r, int reg) {
  return r.base + 512 * (reg % 2) + (r.swizzle ^ uint32_t(16 * (reg / 2)));
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

// A pair of values as two e4m3 pairs whose sums are the values to ~2^-8: hi = e4m3(v), lo =
// e4m3(v - hi) (the parts of q and of P that the FP8 GEMMs take twice).
__device__ __forceinline__ void e4m3x2_split(float a, float b, uint16_t& hi, uint16_t& lo) {
  hi = e4m3x2_of(a, b);
  const float2 back = float2_of_e4m3x2(hi);
  lo = e4m3x2_of(a - back.x, b - back.y);
}

// The q tile as the A operand of S, in two e4m3 parts: hi = e4m3(q x scale), lo = e4m3(q x scale
// - hi), under one power-of-two scale for the whole row block (on the host a scale per row was no
// more accurate: docs/kernel-log.md, 2026-12-05), written by the 256 GEMM threads, 4 a row: thread
// tid takes row tid / 4 (zeros where !valid) and piece tid % 4 (16 values) of each 64-column
// chunk. warp_max: 8 floats of shared memory; barrier: a named barrier id for the 256 threads.
// Returns 1 / scale, the factor of S. The caller fences (generic -> async proxy) and syncs before
// a GEMM reads the tile.
template <class Element>
__device__ __forceinline__ float quantize_q_tile(uint32_t q_hi, uint32_t q_lo, const Element* q_row, bool valid, int tid,
                                                 float* warp_max, uint32_t barrier) {
  constexpr int kChunks = 9, kPieceValues = 16;
  const int row = tid / 4, piece = tid % 4;
  uint4 raw[kChunks][2];
  float amax = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      raw[c][h] = valid ? __ldg(reinterpret_cast<const uint4*>(q_row + 64 * c + kPieceValues * piece + 8 * h)) : make_uint4(0, 0, 0, 0);
      const uint32_t words[4] = {raw[c][h].x, raw[c][h].y, raw[c][h].z, raw[c][h].w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 v = unpack_pair<Element>(words[w]);
        amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
      }
    }
  }
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, offset));
  if (tid % 32 == 0) warp_max[tid / 32] = amax;
  cutlass::arch::NamedBarrier::sync(256, barrier);
#pragma unroll
  for (int w = 0; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
  // A power of two, so that q x scale is still a bf16 value (8 significant bits), which hi + lo
  // (4 + 4) then hold exactly, down to e4m3's subnormals: the largest 2^k with amax 2^k <= 448.
  int exponent = 0;
  const float mantissa = frexpf(amax, &exponent);  // amax = mantissa 2^exponent, mantissa in [0.5, 1)
  const int k = amax > 0.f ? min(126, (mantissa <= 0.875f ? 9 : 8) - exponent) : 0;  // 448 = 0.875 x 2^9
  const float scale = ldexpf(1.f, k);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int w = 0; w < 8; ++w) {  // value pairs 2 w, 2 w + 1 of the piece
      const uint4& r = raw[c][w / 4];
      const uint32_t word = (w % 4 == 0) ? r.x : (w % 4 == 1) ? r.y : (w % 4 == 2) ? r.z : r.w;
      const float2 v = unpack_pair<Element>(word);
      uint16_t h, l;
      e4m3x2_split(v.x * scale, v.y * scale, h, l);
      hi[w / 2] = w % 2 ? hi[w / 2] | uint32_t(h) << 16 : uint32_t(h);
      lo[w / 2] = w % 2 ? lo[w / 2] | uint32_t(l) << 16 : uint32_t(l);
    }
    const uint32_t at = sw64_byte_offset<64>(row, 64 * c + kPieceValues * piece);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(q_hi + at), "r"(hi[0]), "r"(hi[1]), "r"(hi[2]), "r"(hi[3])
                 : "memory");
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(q_lo + at), "r"(lo[0]), "r"(lo[1]), "r"(lo[2]), "r"(lo[3])
                 : "memory");
  }
  return ldexpf(1.f, -k);
}

// Copies gather thread `thread`'s pieces of chunks [kFirst, kLast) of a KV tile (slot[i] < 0: zeros)
// into the 64-byte swizzle at shared address `tile`; each chunk's barrier completes when the 128
// threads' pieces have landed.
template <int kFirst, int kLast>
__device__ __forceinline__ void copy_kv_sw64(int thread, uint32_t tile, const uint8_t* kv, int64_t kv_stride,
                                             const int (&slot)[4], uint64_t* chunk_full) {
  static_assert(kFirst % 2 == 0 && (kLast % 2 == 0 || kLast == 9), "whole pairs of chunks, and the rope chunk");
  // Opaque copies of the bases: the 36 offsets of a pair's two tiles, derived from them here, are
  // not hoisted out of the gather's pair loop and held across it (the gather has 56 registers).
  KvPieceBases b = kv_piece_bases(thread);
  asm volatile("mov.b32 %0, %0;" : "+r"(b.base[0]));
  asm volatile("mov.b32 %0, %0;" : "+r"(b.base[1]));
  asm volatile("mov.b32 %0, %0;" : "+r"(b.rope));
  const int src_col = kv_piece_src_col(thread);
#pragma unroll
  for (int n = kv_piece_begin(kFirst); n < kv_piece_end(kLast); ++n) {
    // Row 16 w + 4 i + l / 8 has slot[i] (constant indices: no local memory).
    const int s = n < 16 ? slot[n % 4] : ((thread % 8) / 4 ? slot[n - 16 + 2] : slot[n - 16]);
    const int col = kv_piece_col(src_col, n);
    cp_async_16(tile + kv_piece_offset(b, n), kv + int64_t(s < 0 ? 0 : s) * kv_stride + col, s >= 0);
  }
#pragma unroll
  for (int c = kFirst; c < kLast; ++c) cutlass::arch::cpasync_barrier_arrive_noinc(&chunk_full[c]);
}

// One warp step of the transpose: ldmatrix.trans from `load` (shared address of this lane's row
// of keys), byte permutes, stmatrix to `store` (its row of V^T).
__device__ __forceinline__ void transpose_v_step(uint32_t load, uint32_t store) {
  uint32_t r[4], w[4];
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(load));
#pragma unroll
  for (int m = 0; m < 4; ++m) w[m] = __byte_perm(r[2 * (m / 2)], r[2 * (m / 2) + 1], transpose_selector(m));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(store), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}

// Warp `warp`'s 16 steps of a warpgroup's transpose of the tile at `tile` into V^T at `vt`.
__device__ __forceinline__ void transpose_v_warp(uint32_t tile, uint32_t vt, int warp, int lane) {
  TransposeBases b = transpose_bases(warp, lane);
  asm volatile("mov.b32 %0, %0;" : "+r"(b.load_base));  // recomputed per tile, not held (see copy_kv_sw64)
  asm volatile("mov.b32 %0, %0;" : "+r"(b.load_unit));
  asm volatile("mov.b32 %0, %0;" : "+r"(b.store_base));
#pragma unroll
  for (int i = 0; i < 16; ++i) transpose_v_step(tile + transpose_load_offset(b, i), vt + transpose_store_offset(b, i));
}

// P (the S accumulator's exponentials, compact fragment of 32 values) as the registers of an FP8
// P V GEMM's A operand, in hi and lo parts (e4m3x2_split); register i of each takes values
// p_register_of(i, 0..3).
template <class Probs>
__device__ __forceinline__ void p_as_e4m3_operands(const Probs& p, uint32_t (&hi)[8], uint32_t (&lo)[8]) {
#pragma unroll
  for (int reg = 0; reg < 8; ++reg) {
    uint32_t hi_word = 0, lo_word = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint16_t h, l;
      e4m3x2_split(p(p_register_of(reg, 2 * half)), p(p_register_of(reg, 2 * half + 1)), h, l);
      hi_word |= uint32_t(h) << (16 * half);
      lo_word |= uint32_t(l) << (16 * half);
    }
    hi[reg] = hi_word;
    lo[reg] = lo_word;
  }
}

}  // namespace ddtree::sm90
