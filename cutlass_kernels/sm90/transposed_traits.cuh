// Shapes, shared memory and tensor-core atoms of the transposed e4m3 kernel
// (verify_attention_transposed.cuh): a CTA takes the N rows of a row block (N = 16, 32 or 64:
// the smallest that holds its rows) over its piece's keys, and computes
//   S^T = K Q^T   (M = 64 keys of a tile, N = the rows, over 576 columns),
//   O^T = V^T P^T (M = a warpgroup's 256 output columns in four m-blocks, N = the rows, over keys),
// the e4m3 tile staying e4m3 in shared memory and widened to fp16 in registers as the A operand
// of RS GEMMs (transposed_operands.cuh: the layouts). Warpgroups 0 and 1 stage q, then take a
// pair's tiles (2 i + w), each owning 256 output columns; warpgroup 2 gathers the tiles.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "../contract.cuh"
#include "transposed_clocks.cuh"
#include "transposed_operands.cuh"  // the stage's layout

namespace ddtree::sm90 {

using namespace cute;

// Named barriers of the GEMM warpgroups (cutlass's NamedBarrier numbers them after the ids it
// reserves): both warpgroups' partial maxima or sums are in shared memory; a warpgroup's new row
// state is (two ids); both P tiles are. kQStaged is the whole CTA's: the GEMM warpgroups have
// staged q, so the gather may issue its tiles past the first (transposed_gather.cuh).
enum TransposedBarrierId : uint32_t { kPartialsReady = 1, kRowState0 = 2, kProbsReady = 4, kQStaged = 5 };

// The barriers, apart from the rest of the state: their place does not depend on N, so the kernel
// sets them up before it knows its rows. Stages up to kMaxTransposedStages.
constexpr int kMaxTransposedStages = 5;
struct TransposedBarriers {
  uint64_t full[kMaxTransposedStages];   // a stage's rows (64 bulk copies) and key bits are in
  uint64_t empty[kMaxTransposedStages];  // both GEMM warpgroups are done with a stage
  uint64_t q_rows;                       // the block's q rows, as they are in memory, are in
};

template <int N>
struct TransposedTraits {
  static_assert(N == 16 || N == 32 || N == 64, "rows per CTA");
  using Element = cutlass::half_t;  // the GEMMs' operands: e4m3 widens to fp16 exactly, q is scaled into its range
  static constexpr int kKeys = kKeyTile, kQkDim = ddtree::kQkDim;
  static constexpr int kRowBytes = kQkDim;  // an e4m3 key row
  static constexpr int kChunks = kQkDim / 64;
  static constexpr int kMmaThreads = 256;
  static constexpr int kThreads = kMmaThreads + 128;
  using Mma = decltype(make_tiled_mma(
      SM90::GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<N>, _16>, GMMA::Major::K, GMMA::Major::K>()));
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<N>, Int<kQkDim>>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<N>, Int<kKeys>>{}));
  // After setmaxnreg (2 x 128 x mma + 128 x gather <= 64 K): at N = 64, O^T's 128 accumulator
  // registers need more than 224 to keep the wgmma pipeline unserialised.
  static constexpr uint32_t kMmaRegisters = N == 64 ? 232 : 224, kGatherRegisters = N == 64 ? 40 : 56;
  // The A operand goes in groups of kSteps k-steps of K (S^T) or kBlocks m-blocks of V^T (O^T):
  // 16 registers a buffer; at N = 64 8 (two groups a chunk or k-step) and two buffers, or the
  // wgmma pipeline is serialised (C7512) beside O^T's 128 accumulator registers.
  static constexpr int kSplit = N == 64 ? 2 : 1, kSteps = 4 / kSplit, kBlocks = 4 / kSplit;
  // A buffers: a group waits for the one kBuffers back, so kBuffers - 1 groups stay in flight
  // (at N = 32 four serialise the wgmma pipeline beside O^T's 64 accumulator registers: C7512).
  static constexpr int kBuffers = N == 64 ? 2 : N == 32 ? 3 : 4;
  static constexpr int kQBytes = N * kQkDim * 2;
  static constexpr int kStageBytes = kTransposedStageBytes;  // transposed_operands.cuh: the rows' places
  // e4m3 stages: as many as fit beside q (a tile's 37 KB is ~1.4 us of an SM's share of the
  // bandwidth, about one memory latency).
  static constexpr int kStages = N == 64 ? 3 : N == 32 ? 4 : 5;
  static_assert(kStages <= kMaxTransposedStages, "TransposedBarriers holds them");
  static constexpr int kStagesOffset = kQBytes;
  static constexpr int kPOffset = kStagesOffset + kStages * kStageBytes;  // P0, then P1
  // q's rows land by bulk copies in the last kQRowStages stages, before any tile: the gather
  // issues the first kEarlyTiles tiles beside them and the rest once q is staged.
  static constexpr int kQRowBytes = kQkDim * 2, kQRowStages = (N * kQRowBytes + kStageBytes - 1) / kStageBytes;
  static constexpr int kQRowsOffset = kStagesOffset + (kStages - kQRowStages) * kStageBytes;
  static constexpr int kEarlyTiles = kStages - kQRowStages;
  static_assert(kEarlyTiles >= 1, "a tile in flight while q is staged");
  static constexpr int kPBytes = N * kKeys * 2;
  struct State {
    alignas(8) uint16_t key_bits[kStages][4];  // [stage][warp]: the warp's 16 keys that have a slot (one 64-bit word a stage)
    float partial[2][4][N];  // [warpgroup][warp][row]: a warp's maximum (or sum) of a row
    float row_max[2][N];     // each warpgroup's copy of the row's reference maximum (base 2, softmax.cuh)
    float row_scale[2][N];   // its rescale factor of the current pair (at the end: the output factor)
    float q_absmax[8];       // the GEMM warps' largest |q| (transposed_q.cuh)
#ifdef DDTREE_WAIT_CLOCKS
    unsigned clock_sums[3][2 + kTransposedWaits];  // the debug build's waits by role (transposed_clocks.cuh)
#endif
  };
  static constexpr int kStateOffset = kPOffset + 2 * kPBytes;
  static constexpr int kSmemBytes = kStateOffset + int(sizeof(State));
  // + 1 KB of alignment slack (the swizzled tiles want 1 KB alignment), the barriers static.
  static_assert(kSmemBytes + 1024 + int(sizeof(TransposedBarriers)) <= 227 * 1024, "fits an SM");
};

// The dynamic shared memory of the kernel, which takes any of the three.
constexpr int kTransposedSmemBytes =
    cute::max(TransposedTraits<16>::kSmemBytes, cute::max(TransposedTraits<32>::kSmemBytes, TransposedTraits<64>::kSmemBytes));

}  // namespace ddtree::sm90
