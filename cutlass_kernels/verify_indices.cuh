// Combined verify indices: request b's keys are [prefix slots || draft slots].
//   verify_indptr[b+1] = verify_indptr[b] + P_b + n_b
//   verify_indices[verify_indptr[b] + j] = j < P_b ? kv_indices[kv_indptr[b] + j]
//                                                  : out_cache_loc[qo_indptr[b] + j - P_b]
// The per-position step, shared by the index-build kernel (verify_indices.cu) and the fused
// preparation kernel (verify_prep.cu).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>

#include "index_view.cuh"

struct VerifyIndexArgs {
  IndexView qo_indptr, kv_indptr, kv_indices, out_cache_loc;
  int batch;
  int64_t total;  // positions: kv_indices.numel() + out_cache_loc.numel()
  int32_t* verify_indptr;
  int32_t* verify_indices;
  int64_t num_threads() const { return std::max<int64_t>(total, batch + 1); }  // one per position and indptr entry
};

// verify_indptr[b] without a scan: both indptrs are cumulative, so the sum of P_e + n_e over
// e < b telescopes to (kv_indptr[b] - kv_indptr[0]) + (qo_indptr[b] - qo_indptr[0]).
struct CombinedIndptr {
  IndexView qo, kv;
  __device__ __forceinline__ int64_t operator[](int64_t b) const { return (kv[b] - kv[0]) + (qo[b] - qo[0]); }
};

// Thread `pos` writes verify_indptr[pos] (pos <= B) and verify_indices[pos]; the request is found
// by binary search in the combined indptr. Positions past the last request's keys get slot 0.
__device__ __forceinline__ void build_verify_index(const VerifyIndexArgs& a, int64_t pos) {
  const CombinedIndptr combined{a.qo_indptr, a.kv_indptr};
  if (pos <= a.batch) a.verify_indptr[pos] = static_cast<int32_t>(combined[pos]);
  if (pos >= a.total) return;
  if (a.batch == 0 || pos >= combined[a.batch]) {
    a.verify_indices[pos] = 0;
    return;
  }
  const int b = owning_request(combined, a.batch, pos);
  const int64_t offset = pos - combined[b];
  const int64_t prefix_len = a.kv_indptr[b + 1] - a.kv_indptr[b];
  const int64_t slot = offset < prefix_len ? a.kv_indices[a.kv_indptr[b] + offset]
                                           : a.out_cache_loc[a.qo_indptr[b] + offset - prefix_len];
  a.verify_indices[pos] = static_cast<int32_t>(slot);
}

// Checks the index tensors, allocates verify_indptr [B+1] and verify_indices [total] (int32).
inline std::tuple<VerifyIndexArgs, at::Tensor, at::Tensor> make_verify_index_args(
    const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices, const at::Tensor& out_cache_loc) {
  TORCH_CHECK(qo_indptr.dim() == 1 && qo_indptr.numel() >= 1, "ddtree_op: qo_indptr must be 1-D of length B+1");
  const int batch = static_cast<int>(qo_indptr.numel() - 1);
  TORCH_CHECK(kv_indptr.numel() >= batch + 1, "ddtree_op: kv_indptr must have at least B+1 entries");
  check_index_tensor(qo_indptr, "qo_indptr");
  check_index_tensor(kv_indptr, "kv_indptr");
  check_index_tensor(kv_indices, "kv_indices");
  check_index_tensor(out_cache_loc, "out_cache_loc");
  const auto opts = qo_indptr.options().dtype(at::kInt);
  at::Tensor verify_indptr = at::empty({batch + 1}, opts);
  const int64_t total = kv_indices.numel() + out_cache_loc.numel();
  at::Tensor verify_indices = at::empty({total}, opts);
  const VerifyIndexArgs args{view_of(qo_indptr), view_of(kv_indptr), view_of(kv_indices), view_of(out_cache_loc), batch,
                             total, verify_indptr.data_ptr<int32_t>(), verify_indices.data_ptr<int32_t>()};
  return {args, verify_indptr, verify_indices};
}
