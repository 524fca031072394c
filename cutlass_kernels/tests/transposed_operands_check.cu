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
#include <cstdio>
#include <random>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "sm90/transposed_operands.cuh"
#include "host_byte_perm.h"

using namespace cute;
using namespace ddtree::sm90;

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
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "all transposed operand checks passed", failures);
  return failures ? 1 : 0;
}
