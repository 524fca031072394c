// Paged KV as a token pool: position `pos` of request b is slot
//   block_table[b, pos / page_size] * page_size + pos % page_size.
// The paged batch is rewritten in the slot-list layout of `mla_tree_verify` (kv_indptr,
// kv_indices, out_cache_loc), which the ordinary preparation op then validates and sanitizes, so
// both entry points follow one set of rules. ddtree_op/prep.py (paged_slot_lists) is the CPU
// program these kernels are tested against; ddtree_op/paged.py's doc has the rules for bad page
// ids and lengths. Each slot block scans the per-request lengths into shared memory itself
// (batches of up to kPagedSharedBatch requests: one launch), then writes slots, a thread per prefix
// position and per row; larger batches scan once in a one-block launch first.
#pragma once
#include <ATen/ATen.h>

#include <cub/block/block_scan.cuh>

#include "index_view.cuh"

// Largest paged batch whose lengths each slot block scans into shared memory itself (its own name:
// the preparation stages up to ddtree::kSharedBatch = 1023 requests).
constexpr int kPagedSharedBatch = 1024;

struct PagedLengthArgs {
  IndexView qo_indptr, cache_seqlens;
  int batch;
  int64_t num_rows;        // T_pad: the draft-row indptr is clamped into [0, num_rows]
  int64_t capacity;        // positions one block-table row holds: max_pages * page_size
  int32_t* qo;             // [B+1] running max of the clamped qo_indptr (monotone); global or shared
  int32_t* kv_indptr;      // [B+1] cumulative prefix lengths (0 for a request that does not fit)
};

// Whether request b's positions fit its table row and hold its drafts.
__device__ __forceinline__ bool paged_request_fits(int64_t seqlen, int64_t num_draft, int64_t capacity) {
  return seqlen >= num_draft && seqlen <= capacity;
}

// kItems consecutive entries per thread (one load round trip for all of them), so a tile of
// kThreads * kItems entries costs one block scan and its two barriers.
template <int kThreads, int kItems>
__device__ void scan_paged_lengths(const PagedLengthArgs& a) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kItems;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t carry;
  const auto max_op = [](int64_t x, int64_t y) { return x > y ? x : y; };
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kItems;
  // Pass 1: qo[e] = max over qo_indptr[0..e], each clamped into [0, num_rows].
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t tile = 0; tile <= a.batch; tile += kTile) {
    int64_t v[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t e = tile + first + j;
      const int64_t x = e <= a.batch ? a.qo_indptr[e] : 0;
      v[j] = max_op(x < 0 ? 0 : (x > a.num_rows ? a.num_rows : x), carry);
    }
    int64_t tile_max;
    Scan(temp).InclusiveScan(v, v, max_op, tile_max);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t e = tile + first + j;
      if (e <= a.batch) a.qo[e] = static_cast<int32_t>(v[j]);
    }
    __syncthreads();  // every thread has read `carry` and `temp` is free again
    if (threadIdx.x == 0) carry = tile_max;
    __syncthreads();
  }
  // Pass 2: prefix lengths (seqlen - drafts where the request fits), summed into kv_indptr.
  if (threadIdx.x == 0) {
    carry = 0;
    a.kv_indptr[0] = 0;
  }
  __syncthreads();
  for (int64_t tile = 0; tile < a.batch; tile += kTile) {
    int64_t prefix[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t e = tile + first + j;
      prefix[j] = 0;
      if (e < a.batch) {
        const int64_t num_draft = a.qo[e + 1] - a.qo[e];
        const int64_t seqlen = a.cache_seqlens[e];
        prefix[j] = paged_request_fits(seqlen, num_draft, a.capacity) ? seqlen - num_draft : 0;
      }
    }
    int64_t prefix_total;
    Scan(temp).InclusiveSum(prefix, prefix, prefix_total);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t e = tile + first + j;
      if (e < a.batch) a.kv_indptr[e + 1] = static_cast<int32_t>(carry + prefix[j]);
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += prefix_total;
    __syncthreads();
  }
}

struct PagedSlotArgs {
  IndexView block_table;  // [>= B, max_pages], row stride table_stride
  int64_t table_stride;
  IndexView cache_seqlens;
  const int32_t* qo;
  const int32_t* kv_indptr;
  int batch;
  int64_t num_rows, page_size, num_pages, capacity, prefix_entries;
  int32_t* kv_indices;     // [prefix_entries]: written up to kv_indptr[B]
  int32_t* out_cache_loc;  // [num_rows]: every entry (-1 outside the batch)
};

struct Int32Indptr {
  const int32_t* data;
  __device__ __forceinline__ int64_t operator[](int64_t i) const { return data[i]; }
};

// The slot of position `pos` of request b (-1: page id out of range, or the request does not fit).
__device__ __forceinline__ int32_t paged_slot(const PagedSlotArgs& a, int b, int64_t pos) {
  if (!paged_request_fits(a.cache_seqlens[b], a.qo[b + 1] - a.qo[b], a.capacity) || pos < 0 || pos >= a.capacity) return -1;
  const int64_t page = a.block_table[b * a.table_stride + pos / a.page_size];
  return page >= 0 && page < a.num_pages ? static_cast<int32_t>(page * a.page_size + pos % a.page_size) : -1;
}

// Thread `i` of [0, prefix_entries + num_rows): a prefix entry, then a draft row.
__device__ __forceinline__ void write_paged_slot(const PagedSlotArgs& a, int64_t i) {
  if (a.batch == 0) {
    if (i >= a.prefix_entries) a.out_cache_loc[i - a.prefix_entries] = -1;
    return;
  }
  if (i < a.prefix_entries) {
    if (i >= a.kv_indptr[a.batch]) return;  // never read by the preparation
    const int b = owning_request(Int32Indptr{a.kv_indptr}, a.batch, i);
    a.kv_indices[i] = paged_slot(a, b, i - a.kv_indptr[b]);
    return;
  }
  const int64_t row = i - a.prefix_entries;
  int32_t slot = -1;
  if (row >= a.qo[0] && row < a.qo[a.batch]) {
    const int b = owning_request(Int32Indptr{a.qo}, a.batch, row);
    slot = paged_slot(a, b, a.kv_indptr[b + 1] - a.kv_indptr[b] + row - a.qo[b]);
  }
  a.out_cache_loc[row] = slot;
}
