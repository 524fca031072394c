// Host-side checks of sm90/transposed_operands.cuh (no GPU needed):
//   nvcc -std=c++17 --expt-relaxed-constexpr -I<cutlass include> -I cutlass_kernels \
//        cutlass_kernels/tests/transposed_operands_check.cu -o /tmp/transposed_operands_check && /tmp/transposed_operands_check
// 1. The RS atom's A fragment is the layout the header assumes: in k-step s, register p (values
//    2 p, 2 p + 1) of thread t is row 16 (t / 32) + (t % 32) / 4 + 8 (p % 2), k positions
//    16 s + 8 (p / 2) + 2 (t % 4) and the next.
// 2. S^T: k_position_of and q_column_at are inverse permutations of a chunk's 64 columns, and the
//    key byte each A value takes (k_register_byte) is q's column at that value's k position.
// 3. O^T: v_output_column maps (m-block, A row) of the 128 threads onto the 256 output columns once
//    each, a thread's eight columns consecutive.
// 4. v_pair_selector puts byte b of both keys' words at bytes 1 and 3 (__byte_perm emulated).
// 5. The accumulators of the 64 x N RS atom (N = 16, 32, 64; S^T, or O^T's two m-blocks at 128 x N):
//    value c + 2 r + 4 j (+ N / 2 b) of thread t is row 16 (t / 32) + (t % 32) / 4 + 8 r (+ 64 b),
//    column 8 j + 2 (t % 4) + c.
// 6. The e4m3 stage: whole rows at stage_key_byte, 16-byte aligned and apart; S^T's 16-byte K
//    loads (k_load_byte) and O^T's 8-byte V loads (v_load_column) read their bytes without bank
//    conflicts (a quarter-warp's 16-byte loads, a half-warp's 8-byte loads).
// 7. stmatrix.trans with the probs_store_row / probs_store_key addresses (the PTX semantics
//    emulated: element (i, j) of a lane-fragment matrix lands in memory row j at column i) puts S^T's
//    value of (key, row) at P's (row, key) (traits.cuh's p_tile_byte_offset), each once.
// 8. q_tile_byte_offset is the address CuTe's q tile (the S^T B operand's layout, on a 1 KB-aligned
//    buffer) gives each (row, column) at N = 16, 32, 64: the swizzle acts on bytes, so a bare
//    layout(n, col) (element offsets) is not it.
#include <cstdio>
#include <random>
#include <vector>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "sm90/traits.cuh"  // p_tile_byte_offset
#include "sm90/transposed_operands.cuh"
#include "host_byte_perm.h"

using namespace cute;
using namespace ddtree::sm90;

using Bf16 = cutlass::bfloat16_t;

template <int N, class Report>
void check_accumulators(Report& report) {
  auto mma = make_tiled_mma(SM90::GMMA::rs_op_selector<Bf16, Bf16, float, Shape<_64, Int<N>, _16>, GMMA::Major::K, GMMA::Major::K>());
  auto s_coords = make_identity_tensor(Shape<_64, Int<N>>{});
  auto o_coords = make_identity_tensor(Shape<_128, Int<N>>{});
  for (int t = 0; t < 128; ++t) {
    const int r0 = 16 * (t / 32) + (t % 32) / 4, q = t % 4;
    auto s = mma.get_slice(t).partition_C(s_coords);
    auto o = mma.get_slice(t).partition_C(o_coords);
    if (size(s) != N / 2 || size(o) != N) report("5 accumulator size", t, N);
    for (int i = 0; i < size(o) && i < N; ++i) {
      const int b = i / (N / 2), v = i % (N / 2), c = v % 2, r = (v / 2) % 2, j = v / 4;
      const int m = r0 + 8 * r, n = 8 * j + 2 * q + c;
      if (get<0>(o(i)) != m + 64 * b || get<1>(o(i)) != n) report("5 O^T accumulator", t, i);
      if (b == 0 && (get<0>(s(i)) != m || get<1>(s(i)) != n)) report("5 S^T accumulator", t, i);
    }
  }
}

template <int N, class Report>
void check_probs_store(Report& report) {
  std::vector<int> written(N * 64, 0);
  for (int w = 0; w < 4; ++w) {
    for (int k = 0; k < N / 16; ++k) {
      for (int mi = 0; mi < 4; ++mi) {
        for (int i = 0; i < 8; ++i) {      // fragment row: lane 4 i + j / 2 holds it
          for (int j = 0; j < 8; ++j) {    // fragment column: that lane's half j % 2
            const int lane = 4 * i + j / 2, g = lane / 4, q = lane % 4, c = j % 2;
            const int block = 2 * k + mi / 2, r = mi % 2;  // register mi of the lane
            const int key = 16 * w + g + 8 * r, row = 8 * block + 2 * q + c;
            const int addr_lane = 8 * mi + j;  // .trans: memory row j of matrix mi, column i
            const uint32_t at = p_tile_byte_offset(probs_store_row(k, addr_lane), probs_store_key(w, addr_lane)) + 2 * i;
            if (at != p_tile_byte_offset(row, key)) report("7 P^T store", 64 * w + 16 * k + mi, 8 * i + j);
            if (row < N) written[row * 64 + key]++;
          }
        }
      }
    }
  }
  for (int e = 0; e < N * 64; ++e) {
    if (written[e] != 1) report("7 P^T each element once", e / 64, e % 64);
  }
}

template <class Report>
void check_stage(Report& report) {
  for (int key = 0; key < 64; ++key) {  // whole rows, 16-byte aligned (bulk copies), apart, inside the stage
    const int at = stage_key_byte(key);
    if (at % 16 != 0 || (key > 0 && at < stage_key_byte(key - 1) + 576) || at + 576 > kTransposedStageBytes) {
      report("6 stage rows", key, at);
    }
  }
  for (int w = 0; w < 4; ++w) {
    for (int c = 0; c < 9; ++c) {  // K: a quarter-warp's 16-byte loads, one of each bank group
      for (int e = 0; e < 2; ++e) {
        for (int quarter = 0; quarter < 4; ++quarter) {
          int groups[8] = {};
          for (int lane = 8 * quarter; lane < 8 * quarter + 8; ++lane) {
            const int key = 16 * w + lane / 4 + 8 * e, q = lane % 4;
            const int at = k_load_byte(16 * w + lane / 4, c, q) + e * stage_key_byte(8);
            if (at != k_load_byte(key, c, q) || at != stage_key_byte(key) + 64 * c + 16 * q) report("6 K load", lane, c);
            groups[(at / 16) % 8]++;
          }
          for (int b = 0; b < 8; ++b) {
            if (groups[b] != 1) report("6 K bank groups", 8 * w + quarter, c);
          }
        }
      }
    }
    for (int wg = 0; wg < 2; ++wg) {  // V: a half-warp's 8-byte loads, 32 distinct banks
      for (int he = 0; he < 16; ++he) {
        const int s = he / 4, h = (he / 2) % 2, e = he % 2;
        for (int half = 0; half < 2; ++half) {
          int banks[32] = {};
          for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
            const int r = lane / 4, q = lane % 4, key = 16 * s + 8 * h + 2 * q + e;
            const int col = 256 * wg + 8 * (8 * w + r);
            const int at = stage_key_byte(key) + v_load_column(wg, w, r);
            if (at != stage_key_byte(key) + col) report("6 V load", lane, he);
            banks[(at / 4) % 32]++;
            banks[(at / 4 + 1) % 32]++;
          }
          for (int b = 0; b < 32; ++b) {
            if (banks[b] != 1) report("6 V banks", 4 * wg + w, he);
          }
        }
      }
    }
  }
}

template <int N, class Report>
void check_q_tile(Report& report) {
  alignas(1024) static Bf16 buffer[64 * 576];
  using Layout = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{}, Shape<Int<N>, Int<576>>{}));
  Tensor q = make_tensor(make_smem_ptr(buffer), Layout{});
  for (int n = 0; n < N; ++n) {
    for (int col = 0; col < 576; ++col) {
      const long at = reinterpret_cast<const char*>(raw_pointer_cast(&q(n, col))) - reinterpret_cast<const char*>(buffer);
      if (at != long(q_tile_byte_offset(N, n, col / 64, col % 64))) report("8 q tile address", n, col);
    }
  }
}

int main() {
  int failures = 0;
  auto report = [&](const char* what, int t, int i) {
    if (failures++ < 8) std::printf("%s: thread %d value %d\n", what, t, i);
  };
  // The A operand of a 64 x 64 x 16 RS GEMM over four k-steps: S^T's keys x a chunk's 64 columns,
  // or O^T's 64 output columns of an m-block x 64 keys.
  auto mma = make_tiled_mma(SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::K>{});
  auto ident = make_identity_tensor(Shape<_64, _64>{});
  int column_seen[256] = {};
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, r = (t % 32) / 4, q = t % 4, r0 = 16 * w + r;
    auto a = mma.get_slice(t).partition_A(ident);
    if (size(a) != 32) report("fragment size", t, int(size(a)));
    for (int i = 0; i < size(a) && i < 32; ++i) {
      const int s = i / 8, v = i % 8, p = v / 2, e = v % 2;
      const int m = get<0>(a(i)), k = get<1>(a(i));
      if (m != r0 + 8 * (p % 2) || k != 16 * s + 8 * (p / 2) + 2 * q + e) report("1 A layout", t, i);
      if (q_column_at(k) != k_register_byte(s, p, q) + e) report("2 S^T key byte", t, i);
    }
    for (int bm = 0; bm < 4; ++bm) {
      for (int i = 0; i < 2; ++i) {
        const int col = v_output_column(bm, w, r, i);
        if (col / 8 != 8 * w + r || col % 8 != 2 * bm + i) report("3 O^T column bytes", t, 2 * bm + i);
        if (q == 0) column_seen[col]++;
      }
    }
  }
  for (int col = 0; col < 256; ++col) {
    if (column_seen[col] != 1) report("3 O^T columns once each", col, column_seen[col]);
  }
  for (int col = 0; col < 64; ++col) {
    if (q_column_at(k_position_of(col)) != col || k_position_of(q_column_at(col)) != col) report("2 inverse", col, 0);
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint32_t x = rng(), y = rng();
    for (int b = 0; b < 4; ++b) {
      const uint32_t out = byte_perm(x, y, v_pair_selector(b));
      if (((out >> 8) & 0xff) != ((x >> (8 * b)) & 0xff) || (out >> 24) != ((y >> (8 * b)) & 0xff)) report("4 selector", trial, b);
    }
  }
  check_accumulators<16>(report);
  check_accumulators<32>(report);
  check_accumulators<64>(report);
  check_probs_store<16>(report);
  check_probs_store<32>(report);
  check_probs_store<64>(report);
  check_stage(report);
  check_q_tile<16>(report);
  check_q_tile<32>(report);
  check_q_tile<64>(report);
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "all transposed operand checks passed", failures);
  return failures ? 1 : 0;
}
