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

struct VerifyIndexArgs {
  IndexView kv_indices, out_cache_loc;
  int batch;
  int64_t total;      // positions: kv_indices.numel() + out_cache_loc.numel()
  int64_t num_slots;  // S: rows of the KV pool (kClampHigh when unknown: no slot check)
  int32_t* verify_indptr;
  int32_t* verify_indices;
  int32_t* qo_indptr_out;  // sanitized qo_indptr [B+1], or nullptr
  int64_t num_threads() const { return std::max<int64_t>(total, batch + 1); }  // one per position and indptr entry
};

// Thread `pos` writes verify_indptr[pos] (and the sanitized qo_indptr[pos]) for pos <= B, and
// verify_indices[pos]; the request is found by binary search in the combined indptr. Positions
// past the last request's keys get slot 0.
template <class Batch>
__device__ __forceinline__ void build_verify_index(const VerifyIndexArgs& a, const Batch& s, ddtree::StatusRecorder& status,
                                                   int64_t pos) {
  const ddtree::KeysBefore<Batch> combined{&s};
  if (pos <= a.batch) {
    a.verify_indptr[pos] = static_cast<int32_t>(combined[pos]);
    if (a.qo_indptr_out != nullptr) a.qo_indptr_out[pos] = static_cast<int32_t>(s.qo_at(static_cast<int>(pos)));
  }
  if (pos >= a.total) return;
  if (a.batch == 0 || pos >= combined[a.batch]) {
    a.verify_indices[pos] = 0;
    return;
  }
  const int b = owning_request(combined, a.batch, pos);
  if (s.is_void(b)) {
    a.verify_indices[pos] = -1;
    return;
  }
  const int64_t offset = pos - combined[b];
  const int64_t prefix_len = s.prefix_len(b);
  const bool from_prefix = offset < prefix_len;
  const int64_t at = from_prefix ? s.raw_kv(b) + offset : s.qo_at(b) + offset - prefix_len;  // in range: sanitized
  const int64_t slot = from_prefix ? a.kv_indices[at] : a.out_cache_loc[at];
  const bool ok = slot >= 0 && slot < a.num_slots;
  if (!ok) status.record(from_prefix ? ddtree::kKvSlot : ddtree::kDraftSlot, at);
  a.verify_indices[pos] = ok ? static_cast<int32_t>(slot) : -1;
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
