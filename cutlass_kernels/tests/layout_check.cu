// Host-side checks of the sm90 kernel's layout algebra (no GPU needed):
//   nvcc -std=c++17 --expt-relaxed-constexpr -I<cutlass include> -I cutlass_kernels \
//        cutlass_kernels/tests/layout_check.cu -o /tmp/layout_check && /tmp/layout_check
// 1. P as the A operand of P V: every register holds the (row, key) of the S accumulator
//    register it is reinterpreted from.
// 2. The V view of the KV tile addresses the same element as the K view: V(n, k) == K(k, n).
// 3. Both warpgroups' accumulators of S and O own the same two rows per thread.
// 4. The O accumulator holds adjacent column pairs: values 4b + 2j and 4b + 2j + 1 are row r0 + 8j,
//    columns 8b + 2 (lane % 4) and the next one (the epilogue stores each pair at once).
// 5. P in shared memory: the rope block (columns 512..575) of a KV stage, at kRopeOffset, is laid
//    out exactly as a 64 x 64 P tile; and P V from shared memory (SS) accumulates into the same
//    registers as P V from registers (RS).
// 6. The S accumulator fragment the kernel makes (and P, made with its layout) is compact, for bf16
//    and fp16: value i
//    sits at register i, so values 2 k and 2 k + 1 are the k-th 32-bit word of a 16-bit P.
#include <cstdio>

#include "sm90/traits.cuh"

using namespace cute;
using Traits = ddtree::sm90::VerifyTraits<cutlass::bfloat16_t>;
alignas(1024) static cutlass::bfloat16_t stage_bytes[64 * 576];  // stands in for a KV stage

int main() {
  int failures = 0;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto ident_s = make_identity_tensor(Shape<_64, _64>{});      // (row, key)
  auto ident_o = make_identity_tensor(Shape<_64, Int<256>>{});  // (row, column)
  for (int t = 0; t < 128; ++t) {
    auto acc_coords = mma_qk.get_slice(t).partition_C(ident_s);
    auto a_coords = mma_pv.get_slice(t).partition_A(ident_s);
    auto as_a = make_tensor(acc_coords.data(), ddtree::sm90::acc_layout_as_a_operand(acc_coords.layout()));
    if (size(as_a) != size(a_coords)) {
      std::printf("size mismatch %d vs %d\n", int(size(as_a)), int(size(a_coords)));
      return 1;
    }
    for (int i = 0; i < size(a_coords); ++i) {
      if (as_a(i) != a_coords(i)) {
        if (failures++ < 5) {
          std::printf("thread %d value %d: acc (%d,%d) vs A operand (%d,%d)\n", t, i, int(get<0>(as_a(i))),
                      int(get<1>(as_a(i))), int(get<0>(a_coords(i))), int(get<1>(a_coords(i))));
        }
      }
    }
    auto o_coords = mma_pv.get_slice(t).partition_C(ident_o);
    int r0 = get<0>(acc_coords(0));
    for (int i = 0; i < size(acc_coords); ++i) {
      int r = get<0>(acc_coords(i));
      if (r != r0 && r != r0 + 8) failures++;
    }
    for (int i = 0; i < size(o_coords); ++i) {
      int r = get<0>(o_coords(i));
      if (r != r0 && r != r0 + 8) failures++;
    }
    for (int i = 0; i + 1 < size(o_coords); i += 2) {
      auto a = o_coords(i), b = o_coords(i + 1);
      if (get<0>(a) != get<0>(b) || get<1>(b) != get<1>(a) + 1 || get<1>(a) % 2 != 0) failures++;
      if (get<0>(a) != r0 + 8 * ((i / 2) % 2)) failures++;  // value 4 b + 2 j is in row r0 + 8 j
      if (get<1>(a) != 8 * (i / 4) + 2 * (t % 4)) failures++;  // ... and column 8 b + 2 (lane % 4)
    }
  }
  typename Traits::TiledMmaPVShared mma_pv_shared;
  for (int t = 0; t < 128; ++t) {
    auto rs = mma_pv.get_slice(t).partition_C(ident_o);
    auto ss = mma_pv_shared.get_slice(t).partition_C(ident_o);
    if (size(rs) != size(ss)) failures++;
    for (int i = 0; i < size(rs) && i < size(ss); ++i) {
      if (rs(i) != ss(i)) failures++;
    }
  }
  typename Traits::SmemLayoutK layout_k;
  typename Traits::SmemLayoutV layout_v;
  // Swizzled byte addresses need a (1 KB aligned) shared-memory pointer: a layout evaluated
  // without one returns the unswizzled offset.
  auto tile_p = make_tensor(make_smem_ptr(stage_bytes), typename Traits::SmemLayoutP{});
  auto tile_k = make_tensor(make_smem_ptr(stage_bytes), typename Traits::SmemLayoutK{});
  auto byte_of = [](auto& element) { return int(reinterpret_cast<char*>(&element) - reinterpret_cast<char*>(stage_bytes)); };
  for (int row = 0; row < 64; ++row) {
    for (int col = 0; col < 64; ++col) {
      const int p_byte = byte_of(tile_p(row, col));
      if (p_byte != int(ddtree::sm90::p_tile_byte_offset(row, col))) failures++;
      if (byte_of(tile_k(row, Traits::kLatent + col)) != 2 * Traits::kRopeOffset + p_byte) failures++;
    }
  }
  // The S accumulator: value 4 b + 2 j (+1) is row r0 + 8 j, columns 8 b + 2 (lane % 4) (+1).
  for (int t = 0; t < 128; ++t) {
    auto s_coords = mma_qk.get_slice(t).partition_C(ident_s);
    int r0 = get<0>(s_coords(0));
    for (int i = 0; i < size(s_coords); ++i) {
      int j = (i / 2) % 2, b = i / 4;
      if (get<0>(s_coords(i)) != r0 + 8 * j || get<1>(s_coords(i)) != 8 * b + 2 * (t % 4) + i % 2) failures++;
    }
  }
  {
    auto frag_s = partition_fragment_C(mma_qk, Shape<Int<Traits::kRows>, Int<Traits::kKeys>>{});
    typename ddtree::sm90::VerifyTraits<cutlass::half_t>::TiledMmaQK mma_qk_fp16;
    auto frag_s_fp16 = partition_fragment_C(mma_qk_fp16, Shape<Int<Traits::kRows>, Int<Traits::kKeys>>{});
    for (int i = 0; i < size(frag_s); ++i) {
      if (frag_s.layout()(i) != i || frag_s_fp16.layout()(i) != i) failures++;
    }
  }
  for (int key = 0; key < 64; ++key) {
    for (int col = 0; col < 512; ++col) {
      if (layout_v(col, key) != layout_k(key, col)) failures++;
    }
  }
  std::printf("S shape per thread: "); print(shape(mma_qk.get_slice(0).partition_C(ident_s))); std::printf("\n");
  std::printf("A shape per thread: "); print(shape(mma_pv.get_slice(0).partition_A(ident_s))); std::printf("\n");
  std::printf("V layout: "); print(layout_v); std::printf("\n");
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "all layout checks passed", failures);
  return failures ? 1 : 0;
}
