// Tree-masked MLA verify attention for sm_90a: the kernel, composed of the tile schedule
// (split, or persistent: tile_scheduler.cuh), the gather (gather.cuh), the main loop
// (mainloop.cuh: the two warpgroups' seesaw over pairs of 64-key tiles, with the tree mask of
// mask_policy.cuh and the online softmax of softmax.cuh) and the epilogue (epilogue.cuh).
//
// Both kernels have grids that are functions of shapes only (the rest is found on the device):
// - split (kPersistent = false): grid (split_grid CTAs), CTA p attending piece p of the plan: a
//   row block of one request (packed rows [64 block, +64), row = draft * H + head) and a range of
//   its keys; CTAs past the pieces write the padding rows (t >= qo_indptr[B]). A row block in one
//   piece writes out/lse; piece k of several writes fp32 partials [k, row] that a combine merges
//   by LSE.
// - persistent (kPersistent = true): grid (CTAs), each walking a list of segments (a row block and
//   a range of its keys). A row block cut into pieces writes fp32 partials [slot, 64 rows], and
//   the CTA that writes its last one merges them (merge.cuh).
// Which request a row block belongs to, and each CTA's segments, come from the plan that the
// preparation made once for the batch (tile_scheduler.cuh).
// Launched as a dependent of the kernel before it (../grid_dependency.cuh): the barriers are set
// up while the preparation finishes, and nothing global is touched before it has.
// With a status, the first CTA publishes what the preparation before it recorded (status.cuh):
// one GEMM thread, after it has issued its q copies, while it would wait for them and for the
// first keys anyway; where that CTA has no keys to attend, before it returns.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "../grid_dependency.cuh"
#include "../index_view.cuh"
#include "../status.cuh"
#include "cta_timeline.cuh"
#include "epilogue.cuh"
#include "gather.cuh"
#include "fp8_tile.cuh"
#include "mainloop.cuh"
#include "merge.cuh"
#include "segment.cuh"
#include "tile_scheduler.cuh"
#include "traits.cuh"
#include "verify_launch.cuh"
#include "verify_params.cuh"

namespace ddtree::sm90 {

// With kOpaque, a copy of v that the compiler cannot see through: values derived from it are not
// hoisted out of the persistent kernel's segment loop and held live across it (that spills).
template <bool kOpaque>
__device__ __forceinline__ int opaque_if(int v) {
  if constexpr (kOpaque) asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}
template <bool kOpaque>
__device__ __forceinline__ uint32_t opaque_if(uint32_t v) {
  if constexpr (kOpaque) asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}

// What the gather needs of a segment, the cache's rows as KvElement.
template <class Traits, class KvElement>
__device__ __forceinline__ GatherPlan<Traits, KvElement> gather_plan(const VerifyParams& p, const SegmentGeometry& g) {
  GatherPlan<Traits, KvElement> plan;
  plan.kv = static_cast<const KvElement*>(p.kv);
  plan.kv_stride = p.kv_stride;
  plan.slots = p.verify_indices + g.kv_lo;
  plan.kv_map = p.kv_boxes ? &p.kv_map : nullptr;
  plan.kv_begin = g.kv_begin;
  plan.kv_end = g.kv_end;
  plan.num_tiles = g.num_tiles;
  return plan;
}

// Warpgroups 0 and 1 compute (mainloop.cuh) and store (epilogue.cuh); warpgroup 2 gathers
// (gather.cuh; an e4m3 cache as it is, widened by the GEMM warpgroups: fp8_tile.cuh, its scale
// multiplying the logits and the output). Every thread walks the same segments; one CTA barrier
// per segment separates a segment's epilogue (which stages the output over q and stage 0) from
// the next one's copies.
template <class Traits, bool kPersistent, bool kFp8Kv>
__global__ void __launch_bounds__(Traits::kThreads, 1) verify_attention_kernel(const __grid_constant__ VerifyParams p) {
  using Element = typename Traits::Element;
  using KvElement = cute::conditional_t<kFp8Kv, uint8_t, Element>;  // e4m3 bytes, or q's dtype
  using SharedState = typename Traits::SharedState;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kRows = Traits::kRows, kLatent = Traits::kLatent, kHalf = Traits::kHalf;
  constexpr int kMmaThreads = Traits::kMmaThreads;

  extern __shared__ uint8_t smem_raw[];
  // SW128 atoms need 1024-byte alignment; the launch asks for 1 KB of slack. The base is an
  // offset from smem_raw, so that the compiler still knows it is shared memory (ld.shared, not
  // generic loads, for the shared state).
  const uint32_t align_pad = (1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u;
  uint8_t* const smem_base = smem_raw + align_pad;
  constexpr int kStateOffset = Traits::kStateOffset;
  const int block = blockIdx.x;
  const bool gather_role = threadIdx.x / 128 == Traits::kGatherWarpgroup;

  // Set-up that reads nothing another kernel writes, while the preparation may still run
  // (../grid_dependency.cuh): the barriers and the TMA descriptor.
  if (threadIdx.x == 0) {
    SharedState& st = *reinterpret_cast<SharedState*>(smem_base + kStateOffset);
    for (int stage = 0; stage < Traits::kStages; ++stage) {
      for (int c = 0; c < Traits::kColumnChunks; ++c) {
        Barrier::init(&st.chunk_full[stage][c], 128 + (c == 0 ? 4 : 0));  // + 4: the key bits of each warp
      }
    }
    Barrier::init(&st.q_full, kMmaThreads);
    for (int g = 0; g < SharedState::kReleaseGroups; ++g) Barrier::init(&st.chunk_empty[g], 128);
#ifdef DDTREE_WAIT_CLOCKS
    for (int r = 0; r < kWaitRoles; ++r) {
      for (int w = 0; w < kWaitSlots; ++w) st.wait_clocks[r][w] = 0;
      for (int e = 0; e < kTraceEvents; ++e) st.trace[r][e] = 0;
    }
#endif
    cutlass::arch::fence_barrier_init();
  }
  if (p.kv_boxes && threadIdx.x == Traits::kGatherWarpgroup * 128) cute::prefetch_tma_descriptor(&p.kv_map);
  wait_for_prior_grids();
  allow_dependent_grids();  // the split kernel's combine may launch; it waits for this grid before reading
  stamp_cta_phase(kCtaEntry);

  Element* const out = static_cast<Element*>(p.out);
  auto zero_padding_block = [&](int64_t row_begin) {
    if (!gather_role) zero_padding_rows<Element, kMmaThreads>(p, row_begin, threadIdx.x);
  };

  // The first segment: a row block of one request and a range of its keys, from the plan. Split
  // schedule: the CTA's piece alone. Persistent schedule: the CTA's first segment.
  const PlanView schedule{p.plan, plan_capacity(p.num_tokens, p.heads, p.batch)};
  const int ctas = static_cast<int>(gridDim.x);
  // Later segments read the CTA's plan from shared memory (after the segment's barrier): held in
  // registers across the segment loop, it spills.
  __shared__ CtaPlan s_cta_plan;
  // The persistent kernel's segment and its geometry for the epilogue, which reads them from here
  // after the pair loop (held in registers across it, they spill). Two of each, by the segment's
  // parity: segment k's are written before its __syncthreads, which every thread passes only
  // after its reads of segment k - 2's.
  __shared__ Segment s_segment[2];
  __shared__ SegmentGeometry s_geometry[2];
  Segment seg{};
  if constexpr (kPersistent) {
    const CtaPlan cta_plan = read_cta_plan(schedule, p.heads, ctas, p.num_splits, block);
    if (threadIdx.x == 0) s_cta_plan = cta_plan;
    const int64_t padding_begin = p.qo_indptr[p.batch] * p.heads;
    for (int64_t r = padding_begin + int64_t(block) * kRows; r < int64_t(p.num_tokens) * p.heads; r += int64_t(ctas) * kRows) {
      zero_padding_block(r);
    }
    if (!plan_segment(cta_plan, block, 0, seg)) {
      if (publishes_status<Traits>(p)) publish_status(p.status);
      return;
    }
  } else if (!plan_piece(schedule, p.heads, p.num_splits, block, seg)) {
    if (!gather_role) zero_padding_past_pieces<Element, kMmaThreads>(p, schedule, block, ctas, threadIdx.x);
    if (publishes_status<Traits>(p)) publish_status(p.status);
    return;
  }

  int pairs_done = 0;  // pairs of earlier segments: every chunk barrier completed one phase per pair
  // The persistent kernel's first segment reaches both roles through s_segment[1] (held in
  // registers across their setmaxnreg, it spills). Each role reads it before segment 0's barrier,
  // and the GEMM role writes s_segment[1] again only for segment 1, after that barrier.
  if constexpr (kPersistent) {
    if (threadIdx.x == 0) s_segment[1] = seg;
    __syncthreads();
  }
  if (gather_role) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::gather_registers(kPersistent, kFp8Kv)>();
    if constexpr (kPersistent) seg = s_segment[1];
    for (int segment = 0;; ++segment) {
      const int wg_thread = opaque_if<kPersistent>(static_cast<int>(threadIdx.x)) % 128;
      uint8_t* const smem = smem_raw + opaque_if<kPersistent>(align_pad);
      SharedState& st = *reinterpret_cast<SharedState*>(smem + kStateOffset);
      const SegmentGeometry g = segment_geometry<Traits, kPersistent>(p, seg);
      __syncthreads();  // the previous segment's epilogue is done with shared memory
      if (g.num_tiles > 0) {
        const uint32_t smem_k = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + Traits::kSmemQ;
        gather_segment<Traits>(gather_plan<Traits, KvElement>(p, g), smem_k, st, pairs_done, wg_thread);
      }
      pairs_done += (g.num_tiles + 1) / 2;
      if constexpr (!kPersistent) {
        break;
      } else {
        Segment next{};  // whole, so that nothing of this segment's stays live into the next
        if (!plan_segment(s_cta_plan, block, segment + 1, next)) break;
        seg = next;
      }
    }
    wait_clock(*reinterpret_cast<SharedState*>(smem_base + kStateOffset), Traits::kGatherWarpgroup, threadIdx.x % 128)
        .store(Traits::kGatherWarpgroup);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::mma_registers(kPersistent, kFp8Kv)>();
  if constexpr (kPersistent) seg = s_segment[1];
  int q_loads = 0;  // q tiles loaded by earlier segments: q_full's phases
  for (int segment = 0;; ++segment) {
    const int tid = opaque_if<kPersistent>(static_cast<int>(threadIdx.x));
    uint8_t* const smem = smem_raw + opaque_if<kPersistent>(align_pad);
    const int warpgroup = tid / 128;
    const int wg_thread = tid % 128;
    Element* smem_q = reinterpret_cast<Element*>(smem);
    Element* smem_k = reinterpret_cast<Element*>(smem + Traits::kSmemQ);
    SharedState& st = *reinterpret_cast<SharedState*>(smem + kStateOffset);
    const SegmentGeometry g = segment_geometry<Traits, kPersistent>(p, seg);
    SegmentKeys keys;
    keys.kv_begin = g.kv_begin;
    keys.num_tiles = g.num_tiles;
    keys.mask = TreeMask{p.mask_words, p.mask_stride, g.q_lo, p.heads, g.num_draft, g.num_rows, g.kv_len - g.num_draft};
    keys.row0 = g.row0;
    keys.scale_log2 = p.scale_log2 * kv_scale_of<kFp8Kv>(p);
    const int num_pairs = (g.num_tiles + 1) / 2;

    const int my_row = (wg_thread / 32) * 16 + (wg_thread % 32) / 4;
    if (num_pairs > 0 && warpgroup == 0 && wg_thread % 4 == 0) st.row_max[my_row] = st.row_max[my_row + 8] = -INFINITY;
    if (kPersistent && tid == 0) {
      s_segment[segment & 1] = seg;
      s_geometry[segment & 1] = g;
    }
    __syncthreads();  // with the gather's: the row maxima (and s_segment) are set before anyone reads them
    const WaitClock clock = wait_clock(st, warpgroup, wg_thread);
    const long long segment_start = clock.now();
    if (num_pairs > 0) {
      const int q_row = g.row0 + tid / 4;
      const bool q_valid = q_row < g.num_rows;
      const Element* q_src = static_cast<const Element*>(p.q) + (g.q_lo + (q_valid ? q_row / p.heads : 0)) * p.q_stride_token +
                             (q_valid ? q_row % p.heads : 0) * p.q_stride_head;
      gather_q<Traits>(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), q_src, q_valid, tid, &st.q_full);
    }
    if (segment == 0 && publishes_status<Traits>(p)) publish_status(p.status);
    if constexpr (!kPersistent) mark_missing_pieces(p, seg, g, tid);
    if (num_pairs > 0) {
      const long long q_waited = clock.now();
      Barrier::wait(&st.q_full, q_loads & 1);
      clock.add(kQWait, q_waited);
      ++q_loads;
    }
    stamp_cta_phase(kCtaQReady);

    typename Traits::TiledMmaPV mma_pv;
    Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kRows>, Int<kHalf>>{});
    clear(acc_o);
    Tensor coord_o = mma_pv.get_slice(wg_thread).partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kHalf>>{}));
    float row_sum[2] = {0.f, 0.f};
    clock.add(kPrologue, segment_start);
    if (warpgroup == 0) {
      run_pairs<Traits, 0, kFp8Kv>(keys, smem_q, smem_k, st, pairs_done, wg_thread, acc_o, row_sum);
    } else {
      run_pairs<Traits, 1, kFp8Kv>(keys, smem_q, smem_k, st, pairs_done, wg_thread, acc_o, row_sum);
    }
    stamp_cta_phase(kCtaLoopDone);

    const long long epilogue_start = clock.now();
    // Both warpgroups' sums (each under the final row maximum) per row.
    using cutlass::arch::NamedBarrier;
    CUTE_UNROLL
    for (int j = 0; j < 2; ++j) row_sum[j] = quad_sum(row_sum[j]);
    if (wg_thread % 4 == 0) {
      st.row_sum[warpgroup][my_row] = row_sum[0];
      st.row_sum[warpgroup][my_row + 8] = row_sum[1];
    }
    // The segment and its geometry: the persistent kernel's from shared memory (s_segment).
    SegmentGeometry eg;
    Segment es;
    if constexpr (kPersistent) {
      eg = s_geometry[segment & 1];
      es = s_segment[segment & 1];
    } else {
      eg = g;
      es = seg;
    }
    const float kv_scale = kv_scale_of<kFp8Kv>(p);  // V's too

    // Row r of the block in out and lse (the merge writes them too).
    auto out_row = [&](int r) {
      const int row = eg.row0 + r;
      return out + (eg.q_lo + row / p.heads) * p.out_stride_token + (row % p.heads) * p.out_stride_head;
    };
    auto lse_at = [&](int r) {
      const int row = eg.row0 + r;
      return p.lse + (eg.q_lo + row / p.heads) * p.lse_stride_token + (row % p.heads) * p.lse_stride_head;
    };
    const int valid_rows = min(kRows, eg.num_rows - eg.row0);  // only a request's last row block is short
    if (eg.part_rows != nullptr) {
      // fp32 partials: each warpgroup stages its half unnormalised as soon as its loop ends (the
      // sums are not needed yet): warpgroup 0 over q (read only by S, which both have finished),
      // warpgroup 1 over stage 0, once warpgroup 0's P0 V0_L (the last reader there besides
      // warpgroup 1's own) has retired: its release of stage 0's low chunks says so.
      if (warpgroup == 1 && num_pairs > 0) {  // the segment's last pair's phase
        cutlass::arch::ClusterBarrier::wait(&st.chunk_empty[SharedState::kStage0Low], (pairs_done + num_pairs - 1) & 1);
      }
      float* const half0 = reinterpret_cast<float*>(smem);  // warpgroup 1's half: kSmemQ bytes on, at stage 0
      constexpr int kHalfDistance = Traits::kSmemQ / int(sizeof(float));
      constexpr int kHalfBytes = kRows * kHalfStride * int(sizeof(float));
      static_assert(kHalfBytes <= Traits::kSmemQ && kHalfBytes <= Traits::kSmemK,
                    "each half fits over q, the other over stage 0, clear of stage 1 and P1");
      const long long staging_start = clock.now();
      stage_half_unnormalised(half0 + warpgroup * kHalfDistance, acc_o, coord_o, my_row);
      NamedBarrier::arrive_and_wait(kMmaThreads, kEpilogueBarrier);  // both halves and both warpgroups' sums
      clock.add(kEpilogueStaging, staging_start);
      if (tid < kRows) {  // row tid's factor (in scale0, free after the pair loop) and lse
        const float total = st.row_sum[0][tid] + st.row_sum[1][tid];
        st.scale0[tid] = row_output_factor(total, kv_scale);
        if (tid < valid_rows) {
          eg.part_lse_rows[tid] = row_lse(st.row_max[tid], total);
        }
      }
      NamedBarrier::arrive_and_wait(kMmaThreads, kEpilogueBarrier);
      const long long stores_start = clock.now();
      store_halves<kRows, kMmaThreads, kHalfDistance>(half0, st.scale0, valid_rows, tid,
                                                       [&](int r) { return eg.part_rows + int64_t(r) * kLatent; });
      clock.add(kEpilogueStores, stores_start);
      if constexpr (kPersistent) {  // the CTA that writes a row block's last partial merges them (merge.cuh)
        const long long merge_start = clock.now();
        const PartialSlots slots = partial_slots(s_cta_plan, es);
        if (wrote_last_partial<kMmaThreads>(schedule.partials_written(es.row_block), slots.count, tid)) {
          merge_partials<Element, kRows, kLatent, kMmaThreads>(p.part_out, p.part_lse, slots, valid_rows, tid, out_row, lse_at);
        }
        clock.add(kEpilogueMerge, merge_start);
      }
    } else {
      NamedBarrier::arrive_and_wait(kMmaThreads, kEpilogueBarrier);
      clock.add(kEpilogueSums, epilogue_start);
      float lse_row[2], inv_sum[2];
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float total = row_sum[j] + st.row_sum[1 - warpgroup][my_row + 8 * j];
        inv_sum[j] = row_output_factor(total, kv_scale);
        lse_row[j] = row_lse(st.row_max[my_row + 8 * j], total);
      }
      // lse from warpgroup 0's quad leaders, the tile through shared memory.
      if (warpgroup == 0 && wg_thread % 4 == 0) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int r = my_row + 8 * j;
          if (r < valid_rows) *lse_at(r) = lse_row[j];
        }
      }
      store_tile_through_smem<Element, kRows, kLatent, kMmaThreads>(smem, acc_o, coord_o, my_row, warpgroup * kHalf, inv_sum,
                                                                     valid_rows, tid, out_row, clock);
    }
    clock.add(kEpilogue, epilogue_start);
    pairs_done += num_pairs;
    if constexpr (!kPersistent) {
      break;
    } else {
      // The epilogue's staging stores (generic proxy) over stage 0 before the next segment's TMA
      // boxes (async proxy) write it; the segment's __syncthreads orders the two.
      cutlass::arch::fence_view_async_shared();
      Segment next{};  // whole, so that nothing of this segment's stays live into the next
      if (!plan_segment(s_cta_plan, block, segment + 1, next)) break;
      seg = next;
    }
  }
  stamp_cta_phase(kCtaStored);
  const int warpgroup = threadIdx.x / 128;
  wait_clock(*reinterpret_cast<SharedState*>(smem_base + kStateOffset), warpgroup, threadIdx.x % 128).store(warpgroup);
}

// The launch that verify_launch.cuh declares, each specialization in a translation unit of its own
// (verify_attention_<dtype>[_fp8]_<schedule>.cu), so that the kernels compile in parallel.
template <class Element, bool kPersistent, bool kFp8Kv>
void launch_verify_attention(const VerifyParams& params, dim3 grid, cudaStream_t stream) {
  using Traits = VerifyTraits<Element>;
  auto kernel = verify_attention_kernel<Traits, kPersistent, kFp8Kv>;
  const int smem = Traits::kSmemBytes + 1024;  // + alignment slack for the swizzled tiles
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Chained to the preparation before it (../grid_dependency.cuh).
  C10_CUDA_CHECK(launch_dependent(kernel, grid, dim3(Traits::kThreads), smem, stream, params));
  print_wait_clocks_after(stream);
  print_cta_timeline_after(stream, static_cast<int>(grid.x), kPersistent ? kTimelinePersistent : kTimelineSplit);
}

}  // namespace ddtree::sm90
