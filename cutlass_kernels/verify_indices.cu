// The combined-index op (verify_indices.cuh has the layout): one launch on the current stream
// (two above kSharedBatch requests), no host reads, so it is capturable in CUDA graphs. It
// sanitizes the batch with what it knows (no T_pad, no S: slots pass unchecked); prepare_verify
// is the bounds-checked path.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "verify_indices.cuh"

namespace {

constexpr int kThreads = 256;

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) build_verify_indices_kernel(ddtree::BatchLimits limits,
                                                                        const ddtree::IndptrBounds* bounds, VerifyIndexArgs args) {
  ddtree::StatusRecorder no_status(ddtree::StatusView{nullptr, nullptr});
  const auto batch = [&] {
    if constexpr (kStaged) return ddtree::sanitize_staged(limits, no_status, false);
    else return ddtree::sanitized_from(limits, bounds);
  }();
  build_verify_indices<1>(args, batch, no_status, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, blockDim.x);
}

std::tuple<at::Tensor, at::Tensor> build_verify_indices_cuda(const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                                             const at::Tensor& kv_indices,
                                                             const at::Tensor& out_cache_loc) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  auto [args, verify_indptr, verify_indices] =
      make_verify_index_args(qo_indptr, kv_indptr, kv_indices, out_cache_loc, ddtree::kClampHigh);
  const ddtree::BatchLimits limits =
      ddtree::make_batch_limits(qo_indptr, kv_indptr, c10::nullopt, ddtree::kClampHigh, out_cache_loc.numel(),
                                kv_indices.numel(), ddtree::kClampHigh, 0, 0);
  const int blocks = static_cast<int>(args.num_blocks(kThreads, 1));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (limits.batch <= ddtree::kSharedBatch) {
    build_verify_indices_kernel<true><<<blocks, kThreads, 0, stream>>>(limits, nullptr, args);
  } else {
    auto [bounds, unused] = ddtree::launch_sanitize_indptrs(qo_indptr, limits, ddtree::StatusView{nullptr, nullptr}, false, stream);
    build_verify_indices_kernel<false><<<blocks, kThreads, 0, stream>>>(
        limits, reinterpret_cast<const ddtree::IndptrBounds*>(bounds.data_ptr<int64_t>()), args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {verify_indptr, verify_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("build_verify_indices", &build_verify_indices_cuda); }
