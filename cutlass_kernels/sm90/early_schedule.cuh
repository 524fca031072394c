// The split kernel's early start: each CTA finds its row block and reads its keys' slots from the
// raw batch itself, so that it runs while the preparation still converts the mask, checks the
// slots and plans (the preparation's launch lets it start at once: grid_dependency.cuh). It waits
// for the preparation only where it reads what that writes: the mask words of a tile that reaches
// the drafts (mask_policy.cuh) and the status it publishes.
//
// Both come from the same sanitized batch (../verify_status.cuh): the CTA stages the indptrs and
// votes as every preparation block does, so its request, its key count and each key's slot are
// those of the preparation's plan and verify_indices, bit for bit (the index build is
// ../verify_indices.cuh; the row blocks' order is ../verify_plan.cuh's).
#pragma once

#include <cstdint>

#include "../contract.cuh"
#include "../index_view.cuh"
#include "../status.cuh"
#include "../verify_status.cuh"

namespace ddtree::sm90 {

// The raw inputs of the step that the early start reads.
struct BatchSources {
  BatchLimits limits;  // the raw qo_indptr and kv_indptr, and the bounds the preparation sanitizes with
  IndexView kv_indices, out_cache_loc;
  int64_t num_slots;  // S, rows of the pool
};

// Where a request's keys come from: key k < prefix_len is kv_indices[prefix_at + k], the others
// out_cache_loc[draft_at + k - prefix_len]; a void request's keys, and slots outside [0, S), are -1.
struct KeySource {
  IndexView kv_indices, out_cache_loc;
  int64_t prefix_at, draft_at, num_slots;
  int prefix_len;
  bool void_request;

  __device__ __forceinline__ int slot(int key) const {
    int64_t v = -1;
    if (!void_request) v = key < prefix_len ? kv_indices[prefix_at + key] : out_cache_loc[draft_at + key - prefix_len];
    return v >= 0 && v < num_slots ? static_cast<int>(v) : -1;
  }
};

// A CTA's row block of the sanitized batch: block `block` of request `request` (the plan's
// entry), or, with request == B, padding block `block` (rows from qo_indptr[B] * H on).
struct RowBlockSpan {
  int request, block;
  int num_draft, prefix_len;
  int64_t q_lo, prefix_at;
  bool void_request;
  int64_t padding_begin;  // qo_indptr[B] * H: the first padding row
};

// Row block `row_block` of the staged batch, the same for every thread of the CTA (each calls
// this: it synchronises the block). Requests are taken in consecutive runs a thread, their row
// blocks summed by one block scan.
template <int kThreads>
__device__ __forceinline__ RowBlockSpan locate_row_block(const SanitizedBatch<true>& s, int heads, int row_block) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ int s_warp_blocks[kWarps];
  __shared__ RowBlockSpan s_span;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int per_thread = (s.batch + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per_thread;
  auto blocks_of = [&](int b) {
    return static_cast<int>((s.num_draft(b) * heads + kRowsPerBlock - 1) / kRowsPerBlock);
  };
  int mine = 0;
  for (int i = 0; i < per_thread; ++i) {
    if (first + i < s.batch) mine += blocks_of(first + i);
  }
  int inclusive = mine;
  for (int d = 1; d < 32; d *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) s_warp_blocks[warp] = inclusive;
  __syncthreads();
  int start = inclusive - mine, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) start += s_warp_blocks[w];
    total += s_warp_blocks[w];
  }
  for (int i = 0; i < per_thread; ++i) {
    const int b = first + i;
    if (b >= s.batch) break;
    const int blocks = blocks_of(b);
    if (row_block >= start && row_block < start + blocks) {
      RowBlockSpan span;
      span.request = b;
      span.block = row_block - start;
      span.num_draft = static_cast<int>(s.num_draft(b));
      span.void_request = s.is_void(b);
      span.prefix_len = static_cast<int>(s.prefix_len(b));
      span.q_lo = s.qo_at(b);
      span.prefix_at = span.void_request ? 0 : s.raw_kv(b);
      span.padding_begin = s.qo_at(s.batch) * heads;
      s_span = span;
    }
    start += blocks;
  }
  if (threadIdx.x == 0 && row_block >= total) {
    RowBlockSpan span{};
    span.request = s.batch;
    span.block = row_block - total;
    span.padding_begin = s.qo_at(s.batch) * heads;
    s_span = span;
  }
  __syncthreads();
  return s_span;
}

// The CTA's row block from the raw batch, its indptrs staged in `scratch` (2 * (kSharedBatch + 1)
// int32 of shared memory, free again when this returns). Every thread of the CTA calls it.
template <int kThreads>
__device__ __forceinline__ RowBlockSpan early_row_block(const BatchSources& src, int heads, int row_block, int32_t* scratch) {
  StatusRecorder no_status(StatusView{nullptr, nullptr, nullptr});
  const SanitizedBatch<true> batch =
      sanitize_staged(src.limits, no_status, false, scratch, scratch + kSharedBatch + 1);
  const RowBlockSpan span = locate_row_block<kThreads>(batch, heads, row_block);
  return span;  // locate_row_block's last barrier: every read of the staged indptrs is done
}

__device__ __forceinline__ KeySource key_source(const BatchSources& src, const RowBlockSpan& span) {
  return KeySource{src.kv_indices, src.out_cache_loc, span.prefix_at, span.q_lo, src.num_slots, span.prefix_len,
                   span.void_request};
}

}  // namespace ddtree::sm90
