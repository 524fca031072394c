// Host-side checks of sm90/fp8_operands.cuh (no GPU needed):
//   nvcc -std=c++17 --expt-relaxed-constexpr -I<cutlass include> -I cutlass_kernels \
//        cutlass_kernels/tests/fp8_operands_check.cu -o /tmp/fp8_operands_check && /tmp/fp8_operands_check
// 1. sw64_byte_offset is CuTe's 64-byte-swizzled K-major e4m3 layout (q and KV tiles, V^T, P).
// 2. P as the A operand of an FP8 P V GEMM: value v of register `reg` (p_register_of) is the S
//    accumulator value of the same row and of the key that its slot holds (slot_key), in every
//    thread, and slot_key is a permutation of each 32-key block; p_tile_offset puts a register's
//    four values at their row and slots of a P tile.
// 3. The V^T transpose (transpose_lane, transpose_selector), run through an emulation of
//    ldmatrix.trans.x4 and stmatrix.x4 on a random 64 x 512 tile, writes V^T[n][slot] =
//    V[key of the slot][n] at every byte.
// 4. The gather's pieces (kv_piece) cover a 64 x 576 tile once each, each release group's pieces
//    (kv_piece_begin / kv_piece_end of chunks 0-3 and 4-8) lie in its chunks, and kv_piece_offset
//    (from a thread's bases) is each piece's sw64 offset; so are the transpose's steps from theirs.
#include <cstdio>
#include <cstring>
#include <random>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "sm90/fp8_operands.cuh"
#include "host_byte_perm.h"

using namespace cute;
using Fp8 = cutlass::float_e4m3_t;
using ddtree::sm90::p_register_of;
using ddtree::sm90::slot_key;
using ddtree::sm90::sw64_byte_offset;

alignas(1024) static Fp8 tile_bytes[512 * 64];  // a shared-memory stand-in (swizzled addresses need one)

template <int kRows, int kCols>
int check_sw64() {
  auto tile = make_tensor(make_smem_ptr(tile_bytes), tile_to_shape(GMMA::Layout_K_SW64_Atom<Fp8>{}, Shape<Int<kRows>, Int<kCols>>{}));
  int failures = 0;
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const int cute_byte = int(reinterpret_cast<char*>(&tile(r, c)) - reinterpret_cast<char*>(tile_bytes));
      if (cute_byte != int(sw64_byte_offset<kRows>(r, c))) failures++;
    }
  }
  if (failures) std::printf("sw64 %d x %d: %d offsets differ from CuTe's\n", kRows, kCols, failures);
  return failures;
}

// ldmatrix.m8n8.x4.trans.b16 and stmatrix.m8n8.x4.b16 on a byte array: lane l gives the address of
// row l % 8 of matrix l / 8; lane t's register m holds, loading with .trans, the 16-bit elements
// (row 2 (t % 4), column t / 4) and (row 2 (t % 4) + 1, column t / 4) of matrix m, and, storing
// without it, (row t / 4, columns 2 (t % 4) and + 1).
void ldmatrix_trans_x4(const uint8_t* smem, const uint32_t (&addr)[32], uint32_t (&reg)[32][4]) {
  auto element = [&](int m, int row, int col) {
    uint16_t e;
    std::memcpy(&e, smem + addr[8 * m + row] + 2 * col, 2);
    return uint32_t(e);
  };
  for (int t = 0; t < 32; ++t) {
    for (int m = 0; m < 4; ++m) reg[t][m] = element(m, 2 * (t % 4), t / 4) | element(m, 2 * (t % 4) + 1, t / 4) << 16;
  }
}
void stmatrix_x4(uint8_t* smem, const uint32_t (&addr)[32], const uint32_t (&reg)[32][4]) {
  for (int t = 0; t < 32; ++t) {
    for (int m = 0; m < 4; ++m) std::memcpy(smem + addr[8 * m + t / 4] + 4 * (t % 4), &reg[t][m], 4);
  }
}

int main() {
  int failures = 0;
  failures += check_sw64<64, 576>();  // q (hi, lo) and a KV tile
  failures += check_sw64<512, 64>();  // V^T
  failures += check_sw64<64, 64>();   // P (hi, lo)

  // 2. P's registers.
  for (int block = 0; block < 2; ++block) {
    bool seen[32] = {};
    for (int s = 0; s < 32; ++s) seen[slot_key(s)] = true;
    for (int k = 0; k < 32; ++k) if (!seen[k]) failures++;
  }
  auto mma_s = make_tiled_mma(SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN{});
  auto mma_pv = make_tiled_mma(SM90::GMMA::MMA_64x256x32_F32E4M3E4M3_RS_TN{});
  auto ident = make_identity_tensor(Shape<_64, _64>{});  // (row, key or slot)
  for (int t = 0; t < 128; ++t) {
    auto acc = mma_s.get_slice(t).partition_C(ident);
    auto a = mma_pv.get_slice(t).partition_A(ident);
    if (size(a) != 32 || size(acc) != 32) {
      std::printf("fragment sizes %d, %d\n", int(size(a)), int(size(acc)));
      return 1;
    }
    for (int i = 0; i < 32; ++i) {
      const int reg = i / 4, v = i % 4;
      auto from = acc(p_register_of(reg, v));
      const int slot = get<1>(a(i));
      if (get<0>(from) != get<0>(a(i)) || get<1>(from) != 32 * (slot / 32) + slot_key(slot % 32)) {
        if (failures++ < 5) std::printf("thread %d A value %d (row %d, slot %d) takes (row %d, key %d)\n", t, i, int(get<0>(a(i))),
                                        slot, int(get<0>(from)), int(get<1>(from)));
      }
    }
  }

  // ... and where each register goes in a P tile for the other warpgroup (rows my_row + 8 j of
  // the register's slots; the same for every quad lane).
  for (int t = 0; t < 128; ++t) {
    const int my_row = (t / 32) * 16 + (t % 32) / 4, quad = t % 4;
    for (int reg = 0; reg < 8; ++reg) {
      const int slot = 32 * (reg / 4) + 16 * ((reg / 2) % 2) + 4 * quad;
      if (ddtree::sm90::p_tile_offset(ddtree::sm90::p_tile_row(my_row, quad), reg) != sw64_byte_offset<64>(my_row + 8 * (reg % 2), slot)) {
        failures++;
      }
      auto a = mma_pv.get_slice(t).partition_A(ident);
      if (get<0>(a(4 * reg)) != my_row + 8 * (reg % 2) || get<1>(a(4 * reg)) != slot) failures++;
    }
  }

  // 3. The transpose, on random bytes.
  static uint8_t kv[64 * 576], vt[512 * 64];
  std::mt19937 rng(1);
  for (auto& b : kv) b = uint8_t(rng());
  std::memset(vt, 0, sizeof(vt));
  for (int block = 0; block < 2; ++block) {
    for (int n0 = 0; n0 < 512; n0 += 16) {
      uint32_t load_addr[32], store_addr[32], loaded[32][4], stored[32][4];
      for (int l = 0; l < 32; ++l) {
        const auto lane = ddtree::sm90::transpose_lane(l);
        load_addr[l] = sw64_byte_offset<64>(32 * block + lane.load_key, n0);
        store_addr[l] = sw64_byte_offset<512>(n0 + lane.store_row, 32 * block + lane.store_slot);
      }
      ldmatrix_trans_x4(kv, load_addr, loaded);
      for (int t = 0; t < 32; ++t) {
        for (int m = 0; m < 4; ++m) {
          stored[t][m] = byte_perm(loaded[t][2 * (m / 2)], loaded[t][2 * (m / 2) + 1], ddtree::sm90::transpose_selector(m));
        }
      }
      stmatrix_x4(vt, store_addr, stored);
    }
  }
  int transpose_failures = 0;
  for (int n = 0; n < 512; ++n) {
    for (int slot = 0; slot < 64; ++slot) {
      const int key = 32 * (slot / 32) + slot_key(slot % 32);
      if (vt[sw64_byte_offset<512>(n, slot)] != kv[sw64_byte_offset<64>(key, n)]) transpose_failures++;
    }
  }
  if (transpose_failures) std::printf("transpose: %d bytes of V^T wrong\n", transpose_failures);
  // The warps' steps from their bases: the same addresses as transpose_lane's.
  for (int warp = 0; warp < 4; ++warp) {
    for (int l = 0; l < 32; ++l) {
      const auto b = ddtree::sm90::transpose_bases(warp, l);
      const auto lane = ddtree::sm90::transpose_lane(l);
      for (int i = 0; i < 16; ++i) {
        const int step = 16 * warp + i, block = step / 32, n0 = 16 * (step % 32);
        if (ddtree::sm90::transpose_load_offset(b, i) != sw64_byte_offset<64>(32 * block + lane.load_key, n0)) transpose_failures++;
        if (ddtree::sm90::transpose_store_offset(b, i) != sw64_byte_offset<512>(n0 + lane.store_row, 32 * block + lane.store_slot)) {
          transpose_failures++;
        }
      }
    }
  }
  if (transpose_failures) std::printf("transpose steps: %d failures\n", transpose_failures);
  failures += transpose_failures;

  // 4. The gather's pieces.
  static int covered[64][36];
  for (auto& row : covered) for (int& c : row) c = 0;
  const int groups[2][2] = {{0, 4}, {4, 9}};
  for (const auto& g : groups) {
    for (int t = 0; t < 128; ++t) {
      for (int n = ddtree::sm90::kv_piece_begin(g[0]); n < ddtree::sm90::kv_piece_end(g[1]); ++n) {
        int row = -1, col = -1;
        ddtree::sm90::kv_piece(t, n, row, col);
        if (row < 0 || row >= 64 || col < 0 || col % 16 != 0 || col / 64 < g[0] || col / 64 >= g[1]) {
          failures++;
          continue;
        }
        covered[row][col / 16]++;
        if (ddtree::sm90::kv_piece_offset(ddtree::sm90::kv_piece_bases(t), n) != sw64_byte_offset<64>(row, col)) failures++;
      }
    }
  }
  for (auto& row : covered) for (int c : row) if (c != 1) failures++;

  std::printf("%s (%d failures)\n", failures ? "FAILED" : "all FP8 operand checks passed", failures);
  return failures ? 1 : 0;
}
