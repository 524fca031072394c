// Combined verify indices: request b's keys are [prefix slots || draft slots].
//   verify_indptr[b+1] = verify_indptr[b] + P_b + n_b
//   verify_indices[verify_indptr[b] + j] = j < P_b ? kv_indices[kv_indptr[b] + j]
//                                                  : out_cache_loc[qo_indptr[b] + j - P_b]
// on the sanitized batch (verify_status.cuh): void requests get n_b keys of slot -1, slots
// outside [0, S) become -1. The per-position step, shared by the index-build kernel
// (verify_indices.cu) and the fused preparation kernel (verify_prep.cu).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>

#include "index_view.cuh"
#include "verify_status.cuh"

// Positions a thread of the index build covers where its blocks would not fit the GPU at once
// (the host chooses, verify_prep.cu): a quarter of the blocks staging the batch, and that many
// independent slot loads in flight a thread. Elsewhere one, so that one thread's path, which a
// small launch waits on, stays one lookup long.
constexpr int kWidePositions = 4;

struct VerifyIndexArgs {
  IndexView kv_indices, out_cache_loc;
  int batch;
  int64_t total;      // positions: kv_indices.numel() + out_cache_loc.numel()
  int64_t num_slots;  // S: rows of the KV pool (kClampHigh when unknown: no slot check)
  int32_t* verify_indptr;
  int32_t* verify_indices;
  int32_t* qo_indptr_out;  // sanitized qo_indptr [B+1], or nullptr
  int64_t num_positions() const { return std::max<int64_t>(total, batch + 1); }  // every position and indptr entry
  int64_t num_blocks(int threads, int positions_per_thread) const {  // of `threads` threads
    const int64_t per_block = static_cast<int64_t>(threads) * positions_per_thread;
    return (num_positions() + per_block - 1) / per_block;
  }
};

// Thread positions first + j * stride (j < kPositions, increasing): each writes
// verify_indptr[pos] (and the sanitized qo_indptr[pos]) for pos <= B, and verify_indices[pos]; the
// request is found by binary search in the combined indptr, once per request a thread meets.
// Positions past the last request's keys get slot 0. Every slot is loaded before any is checked
// (a fault's atomics would otherwise keep the later loads behind them).
template <int kPositions, class Batch>
__device__ __forceinline__ void build_verify_indices(const VerifyIndexArgs& a, const Batch& s, ddtree::StatusRecorder& status,
                                                     int64_t first, int64_t stride) {
  enum Source : int { kFill, kPrefix, kDraft };
  const ddtree::KeysBefore<Batch> combined{&s};
  const int64_t used = a.batch == 0 ? 0 : combined[a.batch];
  int b = 0;
  int64_t b_begin = 0, b_end = -1;  // the keys of the request last found
  int64_t at[kPositions], slot[kPositions];
  int source[kPositions];
#pragma unroll
  for (int j = 0; j < kPositions; ++j) {
    const int64_t pos = first + j * stride;
    if (pos <= a.batch) {
      a.verify_indptr[pos] = static_cast<int32_t>(combined[pos]);
      if (a.qo_indptr_out != nullptr) a.qo_indptr_out[pos] = static_cast<int32_t>(s.qo_at(static_cast<int>(pos)));
    }
    source[j] = kFill;
    slot[j] = 0;
    at[j] = 0;
    if (pos >= a.total || pos >= used) continue;
    if (pos >= b_end) {
      b = owning_request(combined, a.batch, pos);
      b_begin = combined[b];
      b_end = combined[b + 1];
    }
    if (s.is_void(b)) {
      slot[j] = -1;
      continue;
    }
    const int64_t offset = pos - b_begin;
    const int64_t prefix_len = s.prefix_len(b);
    const bool from_prefix = offset < prefix_len;
    at[j] = from_prefix ? s.raw_kv(b) + offset : s.qo_at(b) + offset - prefix_len;  // in range: sanitized
    source[j] = from_prefix ? kPrefix : kDraft;
  }
#pragma unroll
  for (int j = 0; j < kPositions; ++j) {
    if (source[j] == kPrefix) slot[j] = a.kv_indices[at[j]];
    else if (source[j] == kDraft) slot[j] = a.out_cache_loc[at[j]];
  }
#pragma unroll
  for (int j = 0; j < kPositions; ++j) {
    const int64_t pos = first + j * stride;
    if (pos >= a.total) continue;
    if (source[j] != kFill && !(slot[j] >= 0 && slot[j] < a.num_slots)) {
      status.record(source[j] == kPrefix ? ddtree::kKvSlot : ddtree::kDraftSlot, at[j], slot[j]);
      slot[j] = -1;
    }
    a.verify_indices[pos] = static_cast<int32_t>(slot[j]);
  }
}

// Checks the index tensors, allocates verify_indptr [B+1] and verify_indices [total] (int32).
inline std::tuple<VerifyIndexArgs, at::Tensor, at::Tensor> make_verify_index_args(
    const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices, const at::Tensor& out_cache_loc,
    int64_t num_slots) {
  TORCH_CHECK(qo_indptr.dim() == 1 && qo_indptr.numel() >= 1 && qo_indptr.numel() <= ddtree::kClampHigh,
              "ddtree_op: qo_indptr must be 1-D of length B+1 < 2^31");
  const int batch = static_cast<int>(qo_indptr.numel() - 1);
  TORCH_CHECK(kv_indptr.numel() >= batch + 1, "ddtree_op: kv_indptr must have at least B+1 entries");
  check_index_tensor(qo_indptr, "qo_indptr");
  check_index_tensor(kv_indptr, "kv_indptr");
  check_index_tensor(kv_indices, "kv_indices");
  check_index_tensor(out_cache_loc, "out_cache_loc");
  const int64_t total = kv_indices.numel() + out_cache_loc.numel();
  TORCH_CHECK(total < ddtree::kClampHigh, "ddtree_op: kv_indices and out_cache_loc must hold fewer than 2^31 - 1 entries together");
  const auto opts = qo_indptr.options().dtype(at::kInt);
  at::Tensor verify_indptr = at::empty({batch + 1}, opts);
  at::Tensor verify_indices = at::empty({total}, opts);
  const VerifyIndexArgs args{view_of(kv_indices), view_of(out_cache_loc), batch, total, num_slots,
                             verify_indptr.data_ptr<int32_t>(), verify_indices.data_ptr<int32_t>(), nullptr};
  return {args, verify_indptr, verify_indices};
}
