// Combined verify indices: request b's keys are [prefix slots || draft slots].
//   verify_indptr[b+1] = verify_indptr[b] + P_b + n_b
//   verify_indices[verify_indptr[b] + j] = j < P_b ? kv_indices[kv_indptr[b] + j]
//                                                  : out_cache_loc[qo_indptr[b] + j - P_b]
// Two launches on the current stream, no host reads: capturable in CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "index_view.cuh"

namespace {

constexpr int kScanThreads = 1024;
constexpr int kGatherThreads = 256;

// One block scans the per-request key counts (P_b + n_b) into verify_indptr.
__global__ void scan_verify_indptr(IndexView qo_indptr, IndexView kv_indptr, int batch, int32_t* verify_indptr) {
  __shared__ int64_t partial[kScanThreads];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) {
    carry = 0;
    verify_indptr[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < batch; base += kScanThreads) {
    const int b = base + threadIdx.x;
    const int64_t len = b < batch ? (kv_indptr[b + 1] - kv_indptr[b]) + (qo_indptr[b + 1] - qo_indptr[b]) : 0;
    partial[threadIdx.x] = len;
    __syncthreads();
    for (int offset = 1; offset < kScanThreads; offset <<= 1) {  // Hillis-Steele inclusive scan
      const int64_t add = threadIdx.x >= offset ? partial[threadIdx.x - offset] : 0;
      __syncthreads();
      partial[threadIdx.x] += add;
      __syncthreads();
    }
    if (b < batch) verify_indptr[b + 1] = static_cast<int32_t>(carry + partial[threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry += partial[threadIdx.x];
    __syncthreads();
  }
}

// One thread per output position; the request is found by binary search in verify_indptr.
__global__ void gather_verify_indices(IndexView qo_indptr, IndexView kv_indptr, IndexView kv_indices,
                                      IndexView out_cache_loc, const int32_t* verify_indptr, int batch,
                                      int64_t total, int32_t* verify_indices) {
  const int64_t pos = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pos >= total) return;
  if (batch == 0 || pos >= verify_indptr[batch]) {
    verify_indices[pos] = 0;
    return;
  }
  const int b = owning_request(verify_indptr, batch, pos);
  const int64_t offset = pos - verify_indptr[b];
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
  auto stream = c10::cuda::getCurrentCUDAStream();
  scan_verify_indptr<<<1, kScanThreads, 0, stream>>>(view_of(qo_indptr), view_of(kv_indptr), batch,
                                                     verify_indptr.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (total > 0) {
    const int blocks = static_cast<int>((total + kGatherThreads - 1) / kGatherThreads);
    gather_verify_indices<<<blocks, kGatherThreads, 0, stream>>>(
        view_of(qo_indptr), view_of(kv_indptr), view_of(kv_indices), view_of(out_cache_loc),
        verify_indptr.data_ptr<int32_t>(), batch, total, verify_indices.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {verify_indptr, verify_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("build_verify_indices", &build_verify_indices_cuda); }
