// Combined verify indices: request b's keys are [prefix slots || draft slots].
//   verify_indptr[b+1] = verify_indptr[b] + P_b + n_b
//   verify_indices[verify_indptr[b] + j] = j < P_b ? kv_indices[kv_indptr[b] + j]
//                                                  : out_cache_loc[qo_indptr[b] + j - P_b]
// One launch on the current stream, no host reads: capturable in CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "index_view.cuh"

namespace {

constexpr int kThreads = 256;

// verify_indptr[b] without a scan: both indptrs are cumulative, so the sum of P_e + n_e over
// e < b telescopes to (kv_indptr[b] - kv_indptr[0]) + (qo_indptr[b] - qo_indptr[0]).
struct CombinedIndptr {
  IndexView qo, kv;
  __device__ __forceinline__ int64_t operator[](int64_t b) const { return (kv[b] - kv[0]) + (qo[b] - qo[0]); }
};

// One thread per output position (and per verify_indptr entry); the request is found by binary
// search in the combined indptr. Positions past the last request's keys get slot 0.
__global__ void build_verify_indices_kernel(IndexView qo_indptr, IndexView kv_indptr, IndexView kv_indices,
                                            IndexView out_cache_loc, int batch, int64_t total,
                                            int32_t* verify_indptr, int32_t* verify_indices) {
  const int64_t pos = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const CombinedIndptr combined{qo_indptr, kv_indptr};
  if (pos <= batch) verify_indptr[pos] = static_cast<int32_t>(combined[pos]);
  if (pos >= total) return;
  if (batch == 0 || pos >= combined[batch]) {
    verify_indices[pos] = 0;
    return;
  }
  const int b = owning_request(combined, batch, pos);
  const int64_t offset = pos - combined[b];
  const int64_t prefix_len = kv_indptr[b + 1] - kv_indptr[b];
  const int64_t slot = offset < prefix_len ? kv_indices[kv_indptr[b] + offset]
                                           : out_cache_loc[qo_indptr[b] + offset - prefix_len];
  verify_indices[pos] = static_cast<int32_t>(slot);
}

std::tuple<at::Tensor, at::Tensor> build_verify_indices_cuda(const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                                             const at::Tensor& kv_indices,
                                                             const at::Tensor& out_cache_loc) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
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
  const int64_t threads = std::max<int64_t>(total, batch + 1);
  const int blocks = static_cast<int>((threads + kThreads - 1) / kThreads);
  build_verify_indices_kernel<<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      view_of(qo_indptr), view_of(kv_indptr), view_of(kv_indices), view_of(out_cache_loc), batch, total,
      verify_indptr.data_ptr<int32_t>(), verify_indices.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {verify_indptr, verify_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("build_verify_indices", &build_verify_indices_cuda); }
