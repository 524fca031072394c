// Tile shapes, shared-memory layouts and tensor-core atoms of the sm_90a verify kernel.
//
// A CTA owns 64 packed (draft row, head) rows of one request and walks a key range in pairs of
// 64-key tiles (mainloop.cuh). Warpgroup w (w = 0, 1) computes S = Q K^T (64 x 64, over 576) for
// tile w of the pair and owns half of the 512 output columns (O is 64 x 256 fp32 per warpgroup:
// 128 registers a thread), for which it needs both tiles' P: its own from registers, the
// other's from shared memory. Warpgroup 2 gathers the tiles (gather.cuh).
// The KV tile in shared memory is laid out once, K-major with 128-byte swizzle; the same bytes
// are read as the K-major B operand of Q K^T and, transposed, as the MN-major B operand of P V.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "../contract.cuh"
#include "wait_clocks.cuh"

namespace ddtree::sm90 {

using namespace cute;

template <class Element_>
struct VerifyTraits {
  using Element = Element_;
  static constexpr int kRows = kRowsPerBlock;  // packed (draft, head) rows per CTA
  static constexpr int kKeys = kKeyTile;      // keys per tile
  static constexpr int kQkDim = ddtree::kQkDim;  // 512 latent + 64 rope
  static constexpr int kLatent = kLatentDim;     // V = first 512 columns of the same row
  static constexpr int kHalf = 256;       // output columns per consumer warpgroup
  static constexpr int kMmaWarpgroups = 2;  // warpgroups 0 and 1: the GEMMs and the softmax
  static constexpr int kMmaThreads = 128 * kMmaWarpgroups;
  static constexpr int kGatherWarpgroup = kMmaWarpgroups;  // warpgroup 2: the gather (gather.cuh)
  static_assert(kGatherWarpgroup == kWaitRoles - 1, "wait_clocks.cuh: the gather is the last role");
  static constexpr int kThreads = kMmaThreads + 128;
  // Registers per thread after setmaxnreg: 2 x 128 x 224 + 128 x 56 = 64512 of the 65536. The
  // persistent kernel's gather of an e4m3 cache holds more across its segment loop (the copy's
  // addresses and the next pair's slots): 2 x 128 x 216 + 128 x 72, the same total.
  static constexpr uint32_t mma_registers(bool persistent, bool fp8_kv) { return persistent && fp8_kv ? 216 : 224; }
  static constexpr uint32_t gather_registers(bool persistent, bool fp8_kv) { return persistent && fp8_kv ? 72 : 56; }
  static constexpr int kStages = 2;       // KV tiles in flight
  static constexpr int kChunkCols = 64;   // a KV tile lands in 64-column chunks (8 KB), one mbarrier each
  static constexpr int kColumnChunks = kQkDim / kChunkCols;  // 9: chunks 0-7 are V, chunk 8 the rope

  using Rows = Int<kRows>;
  using Keys = Int<kKeys>;
  using QkDim = Int<kQkDim>;

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;  // 8 x 64 elements, rows of 128 B
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Rows, QkDim>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Keys, QkDim>{}));
  // V(n, k) = K(k, n): the same bytes, seen as an MN-major (column, key) operand. The K tile
  // stores its 8 x 64 atoms key-block first; tiling the MN-major atom key-block first (Step<_2,_1>)
  // puts every atom at the same offset.
  using SmemLayoutV = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<kLatent>, Keys>{},
                                             Step<_2, _1>{}));

  // P (64 rows x 64 keys, bf16/fp16) in shared memory, K-major like Q. P0 is written into the
  // 64-column rope block of stage 0, which nothing reads after S0; P1 has a tile of its own after
  // the stages, so that stage 1's rope block can be refilled as soon as S1 is done.
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Rows, Keys>{}));
  static constexpr int kRopeOffset = kKeys * kLatent;  // elements; tests/layout_check.cu checks it

  // S = Q K^T: A and B from shared memory, both K-major. One warpgroup per tiled MMA.
  using TiledMmaQK = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}));
  // O += P V: A (probabilities) from registers, B = V from shared memory, MN-major.
  using TiledMmaPV = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>{}));
  // O += P V with the other warpgroup's P, read from shared memory.
  using TiledMmaPVShared = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}));

  static constexpr int kSmemQ = cosize_v<SmemLayoutQ> * int(sizeof(Element));
  static constexpr int kSmemK = cosize_v<SmemLayoutK> * int(sizeof(Element));
  static constexpr int kSmemP = cosize_v<SmemLayoutP> * int(sizeof(Element));
  static constexpr int kP1Offset = kSmemQ + kStages * kSmemK;  // bytes: P1's tile, after the stages

  // What the warpgroups share besides the tiles (after Q and the stages).
  struct SharedState {
    // The parts of a stage that one GEMM warpgroup reads last, released to the gather together:
    // low = chunks 0-3 (warpgroup 0's half of V), high = chunks 4-8 (warpgroup 1's half and the rope).
    enum ReleaseGroup { kStage0Low, kStage0High, kStage1Low, kStage1High, kReleaseGroups };
    uint64_t chunk_full[kStages][kColumnChunks];  // a chunk's 16-byte pieces (and chunk 0: the key bits) are in
    uint64_t q_full;
    uint64_t chunk_empty[kReleaseGroups];         // a release group's last reader is done with it
    uint16_t key_slots[2][kStages][4];  // [pair parity][stage][warp]: keys with a slot (gather.cuh)
    float row_max[kRows];               // reference maximum per row (base 2, softmax.cuh), updated by both in turn
    float scale0[kRows], scale1[kRows]; // each warpgroup's rescale factor of the current pair
    float row_sum[kMmaWarpgroups][kRows];  // the final sums of both warpgroups
#ifdef DDTREE_WAIT_CLOCKS
    unsigned wait_clocks[kWaitRoles][kWaitSlots];            // wait_clocks.cuh: [role][slot]
    unsigned trace[kWaitRoles][kTraceEvents];                // wait_clocks.cuh: [role][event] of the traced pair
#endif
  };
  static constexpr int kStateOffset = kP1Offset + kSmemP;  // bytes
  static constexpr int kSmemBytes = kStateOffset + int(sizeof(SharedState));
  static_assert(kSmemBytes + 1024 <= 227 * 1024, "q, two stages, P1 and the state (+ 1 KB alignment slack) fit an SM");
};

// The fp16 kernel uses the same shapes with fp16 atoms.
template <>
struct VerifyTraits<cutlass::half_t> : VerifyTraits<cutlass::bfloat16_t> {
  using Element = cutlass::half_t;
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using TiledMmaQK = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x64x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x256x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::MN>{}));
  using TiledMmaPVShared = decltype(make_tiled_mma(
      SM90::GMMA::MMA_64x256x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::MN>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Rows, Keys>{}));
};

// Byte offset of element (row, col) in a 64 x 64 16-bit tile laid out K-major with the 128-byte
// swizzle (Traits::SmemLayoutP): 8-row atoms of 1 KB, 128 B per row, 16-byte chunks XOR the row.
__host__ __device__ __forceinline__ uint32_t p_tile_byte_offset(int row, int col) {
  return uint32_t((row / 8) * 1024 + (row % 8) * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2);
}

// The accumulator of S (64 x 64) holds, per thread, ((2 columns, 2 rows, 8 column blocks), 1, 1).
// The A operand of a 64xNx16 RS GMMA holds ((2 columns, 2 rows, 2 k-halves), 1, k-steps).
// Splitting the 8 column blocks into (2 halves, 4 k-steps) turns one into the other;
// tests/layout_check.cu checks this against CuTe's own partitions on the host.
template <class AccLayout>
CUTE_HOST_DEVICE constexpr auto acc_layout_as_a_operand(AccLayout const& acc) {
  auto values = get<0>(acc);                            // (2, 2, N/8)
  auto blocks = logical_divide(get<2>(values), _2{});  // (2, N/16)
  return make_layout(make_layout(get<0>(values), get<1>(values), get<0>(blocks)), get<1>(acc), get<1>(blocks));
}

}  // namespace ddtree::sm90
