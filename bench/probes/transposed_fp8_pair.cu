// The pair loop of the transposed FP8 design, alone (docs/kernel-log.md: the design in the
// twenty-first session, this probe in the twenty-second): the e4m3 cache stays e4m3 in shared
// memory and is widened into registers as the A operand of RS GEMMs,
//   S^T = K Q^T   (M = 64 keys, N = the request's rows, over 576 columns),
//   O^T = V^T P^T (M = a warpgroup's 256 output columns in four m-blocks, N = the rows, over keys),
// with the operand permutations of cutlass_kernels/sm90/transposed_operands.cuh.
// One CTA takes N rows of one request (N = 16, 32, 64: all of H = 16's rows at q_len 1, 2, 4; a
// block of 64 of a request's H q_len rows beyond that) over one contiguous range of its keys,
// every key visible (no tree mask, no split planning), the range a multiple of 128 keys, and
// writes the range's normalised output (fp32) and each row's base-2 log-sum-exp; the caller
// merges the ranges. bench/transposed_fp8_probe.py builds it as a torch
// extension, checks it against a float32 reference and times it beside the package's kernels.
//
// Warpgroups 0 and 1 take the tiles of a pair (2 i + w) and each owns 256 output columns; both
// run the softmax of a pair at the same time (three named barriers a pair): the simple schedule,
// so what it measures is an upper bound of the design's pair. Warpgroup 2 gathers 64-key tiles
// of 576-byte rows by slot with cp.async into 36 KB stages, as many as fit beside q (5, 5, 3 at
// N = 16, 32, 64).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90/async_copy.cuh"          // cp_async_16
#include "sm90/fp8_tile.cuh"            // e4m3x2_bits_to
#include "sm90/numeric.cuh"             // exp2_approx, pack_pair
#include "sm90/traits.cuh"              // p_tile_byte_offset
#include "sm90/transposed_operands.cuh" // the operands' layouts and addresses

#ifndef PROBE_VARIANT
#define PROBE_VARIANT 0
#endif
#ifndef PROBE_SLOT_PREFETCH  // 1: the gather holds a tile's slot ids in a register a lane, loaded a tile ahead
#define PROBE_SLOT_PREFETCH 1
#endif
#ifndef PROBE_A_BUFFERS  // the A operand's register buffers at N = 16, 32 (N = 64 has room for two)
#define PROBE_A_BUFFERS 4
#endif
#ifndef PROBE_BUFFER_CLOCK  // 1: the in-loop A-buffer waits are timed (34 clock reads a pair at N = 16)
#define PROBE_BUFFER_CLOCK 1
#endif

namespace transposed_probe {

using namespace cute;
using namespace ddtree::sm90;  // the layouts of transposed_operands.cuh, e4m3x2_bits_to, exp2_approx, ...

// What a build of the probe does (PROBE_VARIANT): the design itself, two ablations that only time
// (their outputs are wrong) and name where a pair's cycles go, and the design on fp16 operands.
enum Variant {
  kBf16BitTrick,  // bf16 operands; e4m3 widened by fp8_tile.cuh's bit trick (4 integer ops and a bf16x2 multiply a pair)
  kNoWiden,       // the e4m3 words go to the GEMMs unwidened: the pair without its widening (timing only)
  kNoGemm,        // the GEMMs are not issued: the pair without its tensor work (timing only)
  kF16Convert,    // fp16 operands (q converted once a CTA, P stored as fp16); e4m3 widened by cvt.rn.f16x2.e4m3x2
};
constexpr Variant kVariant = Variant(PROBE_VARIANT);
using Element = std::conditional_t<kVariant == kF16Convert, cutlass::half_t, cutlass::bfloat16_t>;

constexpr int kKeys = 64, kRowBytes = 576, kLatent = 512, kQkDim = 576, kChunks = 9;
// Where a pair's cycles go (warpgroup 0's thread 0, means over the pairs): the whole pair, then
// its waits for a tile to land, at the named barriers (the other warpgroup, the softmax's
// exchanges), for its GEMMs to retire (S^T's at its end, O^T's at the pair's end) and, within the
// GEMM sequences, for the group that last read an A buffer to retire before it is refilled.
enum ClockKind { kPairClock, kLandWait, kBarrierWait, kGemmWait, kBufferWait, kClockKinds };
constexpr int kStageBytes = kKeys * kRowBytes;
constexpr int kMmaThreads = 256;
// Named barriers (cutlass's NamedBarrier numbers them after the ids it reserves): both
// warpgroups' partial maxima or sums are in shared memory; a warpgroup's new row state is; both
// P tiles are.
enum Barrier : uint32_t { kPartialsReady = 1, kRowState0 = 2, kProbsReady = 4 };

template <int N>
struct Traits {
  static_assert(N == 16 || N == 32 || N == 64, "rows per CTA");
  using Mma = decltype(make_tiled_mma(
      SM90::GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<N>, _16>, GMMA::Major::K, GMMA::Major::K>()));
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<N>, Int<kQkDim>>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<N>, Int<kKeys>>{}));
  // After setmaxnreg (2 x 128 x mma + 128 x gather <= 64 K): at N = 64, O^T's 128 accumulator
  // registers need more than 224 to keep the wgmma pipeline unserialised.
  static constexpr uint32_t kMmaRegisters = N == 64 ? 232 : 224, kGatherRegisters = N == 64 ? 40 : 56;
  // The A operand goes in groups of kSteps k-steps of K (S^T) or kBlocks m-blocks of V^T (O^T):
  // 16 registers a buffer, at N = 64 8 (two groups a chunk or k-step) and two buffers, or the
  // wgmma pipeline is serialised (C7512) beside O^T's 128 accumulator registers.
  static constexpr int kSplit = N == 64 ? 2 : 1, kSteps = 4 / kSplit, kBlocks = 4 / kSplit;
  // A buffers: a group waits for the one kBuffers back, so kBuffers - 1 groups stay in flight.
  static constexpr int kBuffers = N == 64 ? 2 : PROBE_A_BUFFERS;
  static constexpr int kQBytes = N * kQkDim * 2;
  // e4m3 stages: as many as fit beside q (a tile's 36 KB is ~1.4 us of an SM's share of the
  // bandwidth, about one memory latency: three stages keep only ~1.5 tiles in flight).
  static constexpr int kStages = N == 64 ? 3 : 5;
  static constexpr int kStagesOffset = kQBytes;
  static constexpr int kPOffset = kStagesOffset + kStages * kStageBytes;  // P0, then P1
  static constexpr int kPBytes = N * kKeys * 2;
  struct State {
    uint64_t full[kStages], empty[kStages], q_full;
    float partial[2][4][N];  // [warpgroup][warp][row]: a warp's maximum (or sum) of a row
    float row_max[2][N];     // each warpgroup's copy of the running maximum (base 2)
    float row_scale[2][N];   // its rescale factor of the current pair (at the end: 1 / sum)
  };
  static constexpr int kStateOffset = kPOffset + 2 * kPBytes;
  static constexpr int kSmemBytes = kStateOffset + int(sizeof(State));
  static_assert(kSmemBytes + 1024 <= 227 * 1024, "fits an SM");
};

struct Params {
  const cutlass::bfloat16_t* q;  // [batch * rows, 576]: a request's rows, in blocks_per_request blocks of N
  const uint8_t* kv;    // [pool, 576] e4m3
  const int* slots;     // [batch, keys_per_request]
  float* out;           // [splits, batch * rows, 512]
  float* lse;           // [splits, batch * rows], base 2
  float* pair_cycles;   // [splits, CTAs in x, kClockKinds]: warpgroup 0's thread 0's cycles a pair, or null
  int blocks_per_request, keys_per_request, keys_per_split;
  float scale_log2;     // sm_scale * kv_scale * log2(e)
  float kv_scale;
};

// kWords (1, 2 or 4) consecutive 32-bit words of shared memory.
template <int kWords>
__device__ __forceinline__ void ld_shared_words(uint32_t addr, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 4) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
  } else if constexpr (kWords == 2) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
  } else {
    static_assert(kWords == 1, "1, 2 or 4 words");
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[0]) : "r"(addr));
  }
}

// The two e4m3 values of a word's half (the first in its low byte) as fp16x2: one instruction
// (fp8_operands.cuh's float2_of_e4m3x2 widens the same way, from a 16-bit pair, on to floats). The
// half is picked inside the asm: a 16-bit argument made by `word >> 16` costs a shift each.
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t word, int half) {
  uint32_t out;
  if (half == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(out) : "r"(word));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(out) : "r"(word));
  }
  return out;
}

// K's A fragment of kSteps k-steps from the thread's words of keys r0 (e = 0) and r0 + 8 (e = 1):
// word s of key e gives registers 4 s + e (its bytes 0, 1) and 4 s + 2 + e (bytes 2, 3).
template <int kSteps>
__device__ __forceinline__ void widen_k(const uint32_t (&words)[2][kSteps], uint32_t* a) {
  CUTE_UNROLL
  for (int s = 0; s < kSteps; ++s) {
    CUTE_UNROLL
    for (int e = 0; e < 2; ++e) {
      if constexpr (kVariant == kF16Convert) {
        a[4 * s + e] = f16x2_of_e4m3x2(words[e][s], 0);
        a[4 * s + 2 + e] = f16x2_of_e4m3x2(words[e][s], 1);
      } else if constexpr (kVariant == kNoWiden) {
        a[4 * s + e] = words[e][s];
        a[4 * s + 2 + e] = words[e][s];
      } else {
        a[4 * s + e] = e4m3x2_bits_to<Element>(__byte_perm(words[e][s], 0, 0x1404));
        a[4 * s + 2 + e] = e4m3x2_bits_to<Element>(__byte_perm(words[e][s], 0, 0x3424));
      }
    }
  }
}

// V^T's A fragment of one k-step (16 keys) for kBlocks consecutive m-blocks: words[2 h + e] are
// the thread's words of key 16 s + 8 h + 2 q + e (word bm / 2 holds m-blocks bm, bm + 1);
// register 4 bm + p pairs byte (2 bm + p % 2) % 4 of keys e = 0, 1 of h = p / 2.
template <int kBlocks>
__device__ __forceinline__ void widen_v(const uint32_t (&words)[4][(kBlocks + 1) / 2], uint32_t* a) {
  CUTE_UNROLL
  for (int bm = 0; bm < kBlocks; ++bm) {
    CUTE_UNROLL
    for (int p = 0; p < 4; ++p) {
      const int h = p / 2, b = (2 * bm + p % 2) % 4;
      const uint32_t key0 = words[2 * h][bm / 2], key1 = words[2 * h + 1][bm / 2];
      if constexpr (kVariant == kF16Convert) {  // byte b of both keys to the low half, then widened
        a[4 * bm + p] = f16x2_of_e4m3x2(__byte_perm(key0, key1, uint32_t(b | (4 + b) << 4)), 0);
      } else if constexpr (kVariant == kNoWiden) {
        a[4 * bm + p] = p % 2 ? key1 : key0;
      } else {
        a[4 * bm + p] = e4m3x2_bits_to<Element>(__byte_perm(key0, key1, v_pair_selector(b)));
      }
    }
  }
}

// Reduces each of a thread's kBlocks column pairs (block j: rows 8 j + 2 q, + 1 of the
// accumulator's N) over the warp's eight key lanes (lane / 4) and leaves block lane / 4 %
// kBlocks's result in the lane: a reduce-scatter by halves, each lane keeping the half its lane
// bit names. Every index is static, so the values stay in registers (selecting block lane / 4
// directly puts the array in local memory).
template <int kBlocks, class Op>
__device__ __forceinline__ float2 reduce_scatter_blocks(const float2 (&v)[kBlocks], int lane, Op op) {
  float2 cur[kBlocks];
  CUTE_UNROLL
  for (int j = 0; j < kBlocks; ++j) cur[j] = v[j];
  CUTE_UNROLL
  for (int half = kBlocks / 2; half >= 1; half /= 2) {
    const int mask = 4 * half;
    const bool upper = lane & mask;
    CUTE_UNROLL
    for (int k = 0; k < half; ++k) {
      const float2 keep = upper ? cur[k + half] : cur[k], send = upper ? cur[k] : cur[k + half];
      cur[k] = op(keep, make_float2(__shfl_xor_sync(0xffffffff, send.x, mask), __shfl_xor_sync(0xffffffff, send.y, mask)));
    }
  }
  CUTE_UNROLL
  for (int mask = 4 * kBlocks; mask < 32; mask *= 2) {
    cur[0] = op(cur[0], make_float2(__shfl_xor_sync(0xffffffff, cur[0].x, mask), __shfl_xor_sync(0xffffffff, cur[0].y, mask)));
  }
  return cur[0];
}
struct Max2 {
  __device__ float2 operator()(float2 a, float2 b) const { return make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y)); }
};
struct Sum2 {
  __device__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

template <int N>
__device__ __forceinline__ void gather_role(const Params& p, typename Traits<N>::State& st, uint32_t smem, int t) {
  using T = Traits<N>;
  const int lane = t % 32, warp = t / 32, request = blockIdx.x / p.blocks_per_request, split = blockIdx.y;
  const int* const slots = p.slots + int64_t(request) * p.keys_per_request + int64_t(split) * p.keys_per_split;
  const int tiles = p.keys_per_split / kKeys;
#if PROBE_SLOT_PREFETCH
  // Lane l holds the slot id of the warp's key 16 warp + l % 16 of the tile being issued (`now`);
  // the next tile's is loaded into the other register (`next`) as this one's copies go out, so no
  // copy waits for a slot id's load. Even and odd tiles swap the two registers (a range is whole
  // pairs), so no move waits for the load either; the last tile reloads its own ids.
  auto slot_of = [&](int now, int tile, int key) { return __shfl_sync(0xffffffffu, now, key % 16); };
  auto load_slots = [&](int tile) { return slots[min(tile, tiles - 1) * kKeys + 16 * warp + lane % 16]; };
#else
  auto slot_of = [&](int, int tile, int key) { return slots[tile * kKeys + key]; };
  auto load_slots = [](int) { return 0; };
#endif
  auto issue_tile = [&](int tile, int now, int& next) {
    next = load_slots(tile + 1);
    const int stage = tile % T::kStages;
    if (tile >= T::kStages) cutlass::arch::ClusterBarrier::wait(&st.empty[stage], (tile / T::kStages - 1) & 1);
    const uint32_t dst = smem + T::kStagesOffset + stage * kStageBytes;
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {  // four keys a warp instruction, 128 contiguous bytes each
      const int key = 16 * warp + 4 * i + lane / 8;
      const uint8_t* const src = p.kv + int64_t(slot_of(now, tile, key)) * kRowBytes;
      CUTE_UNROLL
      for (int g = 0; g < 4; ++g) {
        const int unit = 8 * g + lane % 8;
        cp_async_16(dst + key * kRowBytes + 16 * stage_unit(key, unit), src + 16 * unit, true);
      }
    }
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {  // the rope's four units, eight keys a warp instruction
      const int key = 16 * warp + 8 * h + lane / 4, unit = 32 + lane % 4;
      cp_async_16(dst + key * kRowBytes + 16 * unit, p.kv + int64_t(slot_of(now, tile, key)) * kRowBytes + 16 * unit, true);
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(&st.full[stage]);
  };
  int even = load_slots(0), odd;
  issue_tile(0, even, odd);
  issue_tile(1, odd, even);  // a range is whole pairs (run() checks it)
  // q, its columns permuted within each 64-column chunk (k_position_of): a thread's 8 bytes of
  // columns 64 c + 4 i .. + 3 (i < 16) go to two positions, a column pair each.
  {
    const cutlass::bfloat16_t* const q = p.q + int64_t(blockIdx.x) * N * kQkDim;  // the block's rows
    for (int idx = t; idx < N * kQkDim / 4; idx += 128) {
      const int n = idx / (kQkDim / 4), group = idx % (kQkDim / 4), c = group / 16, col = 4 * (group % 16);
      uint2 v;
      asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(q + n * kQkDim + 4 * group));
      if constexpr (kVariant == kF16Convert) {  // q arrives as bf16
        auto to_element = [](uint32_t bf16x2) {
          const float2 f = unpack_pair<cutlass::bfloat16_t>(bf16x2);
          return pack_pair<Element>(f.x, f.y);
        };
        v = make_uint2(to_element(v.x), to_element(v.y));
      }
      const uint32_t at0 = smem + q_tile_byte_offset(N, n, c, k_position_of(col));
      const uint32_t at1 = smem + q_tile_byte_offset(N, n, c, k_position_of(col + 2));
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at0), "r"(v.x) : "memory");
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at1), "r"(v.y) : "memory");
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(&st.q_full);
  }
  for (int tile = 2; tile < tiles; tile += 2) {
    issue_tile(tile, even, odd);
    issue_tile(tile + 1, odd, even);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
}

template <int N>
__device__ __forceinline__ void mma_role(const Params& p, typename Traits<N>::State& st, uint32_t smem, int w, int t) {
  using T = Traits<N>;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kCols = N / 4;  // a thread's rows of q (the accumulators' N): n = 8 j + 2 q + c, index 2 j + c
  const int lane = t % 32, warp = t / 32, g = lane / 4, q = lane % 4;
  const int r0 = 16 * warp + g;

  typename T::Mma mma;
  auto thr = mma.get_slice(t);
  Element* const base = reinterpret_cast<Element*>(__cvta_shared_to_generic(smem));
  Tensor q_desc = thr.partition_fragment_B(make_tensor(make_smem_ptr(base), typename T::SmemLayoutQ{}));  // (V, 1, 36)
  Tensor p_desc0 = thr.partition_fragment_B(
      make_tensor(make_smem_ptr(base + T::kPOffset / 2), typename T::SmemLayoutP{}));  // (V, 1, 4)
  Tensor p_desc1 = thr.partition_fragment_B(make_tensor(make_smem_ptr(base + (T::kPOffset + T::kPBytes) / 2),
                                                        typename T::SmemLayoutP{}));
  Tensor acc_s = partition_fragment_C(mma, Shape<_64, Int<N>>{});  // ((2, 2, N / 8), 1, 1): key r0 + 8 r, row 8 j + 2 q + c
  // O^T in two accumulators of two m-blocks each (m-blocks 0, 1 and 2, 3: output columns by
  // v_output_column), so that an O^T group of two m-blocks names one of them.
  Tensor acc_lo = partition_fragment_C(mma, Shape<_128, Int<N>>{});  // ((2, 2, N / 8), 2, 1)
  Tensor acc_hi = partition_fragment_C(mma, Shape<_128, Int<N>>{});
  clear(acc_lo);
  clear(acc_hi);
  if constexpr (kVariant == kNoGemm) clear(acc_s);  // what the softmax reads, as no GEMM writes it
  auto fence_o = [&] {
    warpgroup_fence_operand(acc_lo);
    warpgroup_fence_operand(acc_hi);
  };
  using ABuffer = decltype(make_tensor<Element>(Shape<Shape<_2, _2, _2>, _1, Int<T::kSteps>>{}));
  ABuffer a_buffers[T::kBuffers];  // indexed by constants only, so they stay in registers
  const auto v_pair_layout = Layout<Shape<Shape<_2, _2, _2>, _2>>{};  // two m-blocks of V^T's A
  float row_sum[kCols];
  CUTE_UNROLL
  for (int i = 0; i < kCols; ++i) row_sum[i] = 0.f;
  if (t < N) st.row_max[w][t] = -INFINITY;

  const uint32_t p_mine = smem + T::kPOffset + w * T::kPBytes;
  const int pairs = p.keys_per_split / (2 * kKeys);
  cutlass::arch::ClusterBarrier::wait(&st.q_full, 0);
  long long clocks[kClockKinds] = {};
  const long long loop_start = clock64();
  // Runs f, its cycles added to clocks[kind].
  auto timed = [&](ClockKind kind, auto&& f) {
    const long long start = clock64();
    f();
    clocks[kind] += clock64() - start;
  };
  // Before group k refills its buffer: the group that last read it (kBuffers back) has retired.
  auto wait_for_buffer = [&] {
    if constexpr (PROBE_BUFFER_CLOCK) {
      timed(kBufferWait, [] { warpgroup_wait<T::kBuffers - 1>(); });
    } else {
      warpgroup_wait<T::kBuffers - 1>();
    }
  };

  for (int pair = 0; pair < pairs; ++pair) {
    // S^T of tile 2 pair + w.
    const int my_tile = 2 * pair + w;
    const uint32_t my_stage = smem + T::kStagesOffset + (my_tile % T::kStages) * kStageBytes;
    timed(kLandWait, [&] { cutlass::arch::ClusterBarrier::wait(&st.full[my_tile % T::kStages], (my_tile / T::kStages) & 1); });
    constexpr int kSteps = T::kSteps, kGroups = kChunks * T::kSplit;
    // Group G: chunk G / kSplit, its words (k-steps) kSteps (G % kSplit) on.
    auto load_k = [&](int group, uint32_t (&words)[2][kSteps]) {
      const int c = group / T::kSplit;  // keys r0 and r0 + 8 share their units' places
      const uint32_t at = my_stage + k_load_byte(r0, c, q) + 4 * kSteps * (group % T::kSplit);
      ld_shared_words(at, words[0]);
      ld_shared_words(at + 8 * kRowBytes, words[1]);
    };
    warpgroup_fence_operand(acc_s);
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    uint32_t k_words[2][kSteps];
    load_k(0, k_words);
    cute::for_each(make_int_sequence<kGroups>{}, [&](auto group_) {
      constexpr int group = decltype(group_)::value, c = group / T::kSplit;
      auto& a = a_buffers[group % T::kBuffers];
      wait_for_buffer();
      warpgroup_fence_operand(a);
      widen_k(k_words, reinterpret_cast<uint32_t*>(a.data()));
      if constexpr (group + 1 < kGroups) load_k(group + 1, k_words);
      warpgroup_fence_operand(a);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int s = 0; s < kSteps && kVariant != kNoGemm; ++s) {
        cute::gemm(mma, a(_, _, s), q_desc(_, _, 4 * c + kSteps * (group % T::kSplit) + s), acc_s);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    });
    timed(kGemmWait, [] { warpgroup_wait<0>(); });
    warpgroup_fence_operand(acc_s);
    fence_o();
    CUTE_UNROLL
    for (int b = 0; b < T::kBuffers; ++b) warpgroup_fence_operand(a_buffers[b]);

    // The pair's maximum of each row: over the thread's two keys, the warp's eight key lanes,
    // then (in shared memory) the four warps of both warpgroups.
    {
      float2 part[N / 8];
      CUTE_UNROLL
      for (int j = 0; j < N / 8; ++j) {
        part[j] = make_float2(fmaxf(acc_s(4 * j), acc_s(4 * j + 2)), fmaxf(acc_s(4 * j + 1), acc_s(4 * j + 3)));
      }
      const float2 warp_max = reduce_scatter_blocks(part, lane, Max2{});
      if (g < N / 8) *reinterpret_cast<float2*>(&st.partial[w][warp][8 * g + 2 * q]) = warp_max;
    }
    timed(kBarrierWait, [] { NamedBarrier::sync(kMmaThreads, kPartialsReady); });
    if (t < N) {
      float tile_max = st.partial[0][0][t];
      CUTE_UNROLL
      for (int k = 1; k < 8; ++k) tile_max = fmaxf(tile_max, st.partial[k / 4][k % 4][t]);
      const float old_max = st.row_max[w][t], new_max = fmaxf(old_max, tile_max * p.scale_log2);
      st.row_scale[w][t] = exp2_approx(old_max - new_max);
      st.row_max[w][t] = new_max;
    }
    timed(kBarrierWait, [&] { NamedBarrier::sync(128, kRowState0 + w); });
    CUTE_UNROLL
    for (int j = 0; j < N / 8; ++j) {
      const float2 m = *reinterpret_cast<const float2*>(&st.row_max[w][8 * j + 2 * q]);
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        acc_s(4 * j + 2 * r) = exp2_approx(fmaf(acc_s(4 * j + 2 * r), p.scale_log2, -m.x));
        acc_s(4 * j + 2 * r + 1) = exp2_approx(fmaf(acc_s(4 * j + 2 * r + 1), p.scale_log2, -m.y));
      }
    }
    float factor[kCols];  // loaded after the exponentials: fewer registers live at once
    CUTE_UNROLL
    for (int j = 0; j < N / 8; ++j) {
      const float2 f = *reinterpret_cast<const float2*>(&st.row_scale[w][8 * j + 2 * q]);
      factor[2 * j] = f.x, factor[2 * j + 1] = f.y;
    }
    CUTE_UNROLL
    for (int i = 0; i < kCols; ++i) row_sum[i] = row_sum[i] * factor[i] + acc_s(4 * (i / 2) + i % 2) + acc_s(4 * (i / 2) + 2 + i % 2);
    bool same = true;
    CUTE_UNROLL
    for (int i = 0; i < kCols; ++i) same = same && factor[i] == 1.f;
    if (!__all_sync(0xffffffff, same)) {
      CUTE_UNROLL
      for (int i = 0; i < N; ++i) {
        acc_lo(i) *= factor[2 * ((i % (N / 2)) / 4) + i % 2];
        acc_hi(i) *= factor[2 * ((i % (N / 2)) / 4) + i % 2];
      }
    }
    // P^T: this warpgroup's tile as P [row][key] (K-major, the B operand of O^T), stored transposed
    // block by block (transposed_operands.cuh, probs_store_row).
    CUTE_UNROLL
    for (int k = 0; k < N / 16; ++k) {
      uint32_t bits[4];
      CUTE_UNROLL
      for (int mi = 0; mi < 4; ++mi) {
        const int j = 2 * k + mi / 2, r = mi % 2;
        bits[mi] = pack_pair<Element>(acc_s(4 * j + 2 * r), acc_s(4 * j + 2 * r + 1));
      }
      const uint32_t addr = p_mine + p_tile_byte_offset(probs_store_row(k, lane), probs_store_key(warp, lane));
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(bits[0]),
                   "r"(bits[1]), "r"(bits[2]), "r"(bits[3])
                   : "memory");
    }
    cutlass::arch::fence_view_async_shared();
    timed(kBarrierWait, [] { NamedBarrier::sync(kMmaThreads, kProbsReady); });

    // O^T += V^T P^T over both tiles, this warpgroup's 256 columns.
    mma.accumulate_ = GMMA::ScaleOut::One;
    fence_o();
    cute::for_each(make_int_sequence<2>{}, [&](auto t2_) {
      constexpr int t2 = decltype(t2_)::value;
      constexpr int kBlocks = T::kBlocks, kWords = kBlocks / 2;
      const int tile = 2 * pair + t2;
      const uint32_t stage = smem + T::kStagesOffset + (tile % T::kStages) * kStageBytes;
      const uint32_t v_col = v_load_column(w, warp, g, q);
      auto& p_desc = t2 == 0 ? p_desc0 : p_desc1;
      // Group (k-step s, m-half mh): kBlocks m-blocks from mh kBlocks on.
      cute::for_each(make_int_sequence<4 * T::kSplit>{}, [&](auto group_) {
        constexpr int group = decltype(group_)::value, s = group / T::kSplit, mh = group % T::kSplit;
        constexpr int k = 4 * T::kSplit * t2 + group;
        auto& a = a_buffers[k % T::kBuffers];
        uint32_t v_words[4][kWords];
        CUTE_UNROLL
        for (int he = 0; he < 4; ++he) {
          const int key = 16 * s + 8 * (he / 2) + 2 * q + he % 2;
          ld_shared_words(stage + key * kRowBytes + v_col + 4 * kWords * mh, v_words[he]);
        }
        wait_for_buffer();
        warpgroup_fence_operand(a);
        widen_v<kBlocks>(v_words, reinterpret_cast<uint32_t*>(a.data()));
        warpgroup_fence_operand(a);
        warpgroup_arrive();
        Element* const regs = raw_pointer_cast(a.data());
        if constexpr (kVariant == kNoGemm) {
          // timing only: no GEMM
        } else if constexpr (T::kSplit == 1) {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_lo);
          cute::gemm(mma, make_tensor(regs + 16, v_pair_layout), p_desc(_, _, s), acc_hi);
        } else if constexpr (mh == 0) {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_lo);
        } else {
          cute::gemm(mma, make_tensor(regs, v_pair_layout), p_desc(_, _, s), acc_hi);
        }
        warpgroup_commit_batch();
      });
      // The tile's bytes are in registers: its stage goes back to the gather.
      cutlass::arch::ClusterBarrier::arrive(&st.empty[tile % T::kStages]);
    });
    // Waited here, not under the next S^T's first group: ptxas serialises every wgmma of the
    // loop (C7514) when O^T's last group stays in flight into the next pair.
    timed(kGemmWait, [] { warpgroup_wait<0>(); });
    fence_o();
  }

  clocks[kPairClock] = clock64() - loop_start;
  if (p.pair_cycles != nullptr && w == 0 && t == 0) {
    CUTE_UNROLL
    for (int k = 0; k < kClockKinds; ++k) {
      p.pair_cycles[(int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kClockKinds + k] = float(clocks[k]) / float(pairs);
    }
  }

  // Each row's sum over all lanes, warps and both warpgroups; the output scaled by kv_scale / sum.
  {
    float2 part[N / 8];
    CUTE_UNROLL
    for (int j = 0; j < N / 8; ++j) part[j] = make_float2(row_sum[2 * j], row_sum[2 * j + 1]);
    const float2 warp_sum = reduce_scatter_blocks(part, lane, Sum2{});
    if (g < N / 8) *reinterpret_cast<float2*>(&st.partial[w][warp][8 * g + 2 * q]) = warp_sum;
  }
  NamedBarrier::sync(kMmaThreads, kPartialsReady);
  const int64_t row_base = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * N;
  if (t < N) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int k = 0; k < 8; ++k) sum += st.partial[k / 4][k % 4][t];
    st.row_scale[w][t] = p.kv_scale / sum;
    if (w == 0) p.lse[row_base + t] = st.row_max[w][t] + log2f(sum);
  }
  NamedBarrier::sync(128, kRowState0 + w);
  CUTE_UNROLL
  for (int i = 0; i < kCols; ++i) {
    const int n = 8 * (i / 2) + 2 * q + i % 2;
    const float f = st.row_scale[w][n];
    float v[8];  // columns 256 w + 8 (8 warp + g) + 2 bm + r
    CUTE_UNROLL
    for (int bm = 0; bm < 4; ++bm) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int at = i % 2 + 2 * r + 4 * (i / 2) + (N / 2) * (bm % 2);
        v[2 * bm + r] = (bm < 2 ? acc_lo(at) : acc_hi(at)) * f;
      }
    }
    float4* const dst = reinterpret_cast<float4*>(p.out + (row_base + n) * kLatent + 256 * w + 8 * (8 * warp + g));
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <int N>
__global__ void __launch_bounds__(384, 1) transposed_pair_kernel(const __grid_constant__ Params p) {
  using T = Traits<N>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1 KB alignment
  auto& st = *reinterpret_cast<typename T::State*>(smem_raw + (smem - raw) + T::kStateOffset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&st.full[s], 128);
      cutlass::arch::ClusterBarrier::init(&st.empty[s], kMmaThreads);
    }
    cutlass::arch::ClusterBarrier::init(&st.q_full, 128);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  if (warpgroup == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits<N>::kGatherRegisters>();
    gather_role<N>(p, st, smem, t);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits<N>::kMmaRegisters>();
    mma_role<N>(p, st, smem, warpgroup, t);
  }
}

template <int N>
void launch(const Params& p, int ctas, int splits, cudaStream_t stream) {
  const int bytes = Traits<N>::kSmemBytes + 1024;
  TORCH_CHECK(cudaFuncSetAttribute(transposed_pair_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess);
  transposed_pair_kernel<N><<<dim3(ctas, splits), 384, bytes, stream>>>(p);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "transposed_pair_kernel launch");
}

// rows: a request's rows (16, 32, or a multiple of 64). out [splits, batch * rows, 512] fp32, lse
// [splits, batch * rows] (base 2). pair_cycles: an empty tensor, or [splits, batch * blocks, 5]
// float32 (blocks: rows / 64, or 1): each CTA's cycles a pair (ClockKind).
void run(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& slots, torch::Tensor& out, torch::Tensor& lse,
         torch::Tensor& pair_cycles, double sm_scale, double kv_scale, int64_t rows, int64_t splits) {
  TORCH_CHECK(q.dtype() == torch::kBFloat16 && q.is_contiguous() && q.size(-1) == kQkDim, "q: [batch * rows, 576] bf16");
  TORCH_CHECK(kv.element_size() == 1 && kv.is_contiguous() && kv.size(-1) == kRowBytes, "kv: [pool, 576] e4m3 bytes");
  TORCH_CHECK(slots.dtype() == torch::kInt32 && slots.dim() == 2 && slots.is_contiguous(), "slots: [batch, keys] int32");
  const int batch = int(slots.size(0)), keys = int(slots.size(1));
  TORCH_CHECK(keys % (splits * 2 * kKeys) == 0, "each split's keys: a multiple of 128");
  TORCH_CHECK(out.dtype() == torch::kFloat32 && out.is_contiguous() && out.size(2) == kLatent, "out: [splits, batch * rows, 512] fp32");
  TORCH_CHECK(lse.dtype() == torch::kFloat32 && lse.is_contiguous(), "lse: [splits, batch * rows] fp32");
  TORCH_CHECK(q.size(0) == batch * rows && out.size(0) == splits && out.size(1) == batch * rows && lse.numel() == splits * batch * rows);
  TORCH_CHECK(rows == 16 || rows == 32 || rows % 64 == 0, "rows: 16, 32 or a multiple of 64");
  const int n = rows < 64 ? int(rows) : 64, blocks = int(rows / n);
  TORCH_CHECK(pair_cycles.numel() == 0 || (pair_cycles.numel() == splits * batch * blocks * kClockKinds &&
                                            pair_cycles.dtype() == torch::kFloat32 && pair_cycles.is_contiguous()),
              "pair_cycles: empty or [splits, batch * blocks, 5] float32");
  Params p{reinterpret_cast<const cutlass::bfloat16_t*>(q.data_ptr()), reinterpret_cast<const uint8_t*>(kv.data_ptr()),
           slots.data_ptr<int>(), out.data_ptr<float>(), lse.data_ptr<float>(),
           pair_cycles.numel() ? pair_cycles.data_ptr<float>() : nullptr, blocks, keys, int(keys / splits),
           float(sm_scale * kv_scale * 1.4426950408889634), float(kv_scale)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
#ifdef PROBE_ROWS  // one N only: a build in a third of the time
  TORCH_CHECK(n == PROBE_ROWS, "rows: this build takes N = ", PROBE_ROWS, " only");
  launch<PROBE_ROWS>(p, batch * blocks, int(splits), stream);
#else
  if (n == 16) {
    launch<16>(p, batch * blocks, int(splits), stream);
  } else if (n == 32) {
    launch<32>(p, batch * blocks, int(splits), stream);
  } else {
    launch<64>(p, batch * blocks, int(splits), stream);
  }
#endif
}

}  // namespace transposed_probe

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &transposed_probe::run); }
