// The mask-conversion op (tree_mask.cuh has the layouts): one launch on the current stream (two
// above kSharedBatch requests), no host reads, so it is capturable in CUDA graphs. It sanitizes
// the batch with what it knows (rows bounded by num_rows; no kv_indices, so prefix ends are not
// bounded).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "tree_mask.cuh"

namespace {

constexpr int kThreads = 256;

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) convert_tree_mask_kernel(ddtree::BatchLimits limits, const ddtree::IndptrBounds* bounds,
                                                                     TreeMaskArgs args) {
  ddtree::StatusRecorder no_status(ddtree::StatusView{nullptr, nullptr});
  const auto batch = [&] {
    if constexpr (kStaged) return ddtree::sanitize_staged(limits, no_status, false);
    else return ddtree::sanitized_from(limits, bounds);
  }();
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  convert_tree_mask_word(args, batch, no_status, thread / 32, threadIdx.x % 32);  // one warp per word
}

at::Tensor convert_tree_mask_cuda(const at::Tensor& tree_mask, const c10::optional<at::Tensor>& mask_indptr,
                                  const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, c10::string_view layout,
                                  int64_t num_rows, int64_t words_per_row) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  auto [args, words] = make_tree_mask_args(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row);
  if (args.num_words() == 0) return words;
  TORCH_CHECK(kv_indptr.numel() >= qo_indptr.numel(), "ddtree_op: kv_indptr must have at least B+1 entries");
  const int packed_width = packed_mask_width(tree_mask, layout);
  const ddtree::BatchLimits limits = ddtree::make_batch_limits(
      qo_indptr, kv_indptr, c10::nullopt, num_rows, ddtree::kClampHigh, ddtree::kClampHigh, 64 * words_per_row, 0, packed_width);
  const int64_t blocks = (args.num_words() * 32 + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "ddtree_op: a compact mask of ", args.num_words(), " words needs more than 2^31 - 1 blocks");
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (limits.batch <= ddtree::kSharedBatch) {
    convert_tree_mask_kernel<true><<<static_cast<int>(blocks), kThreads, 0, stream>>>(limits, nullptr, args);
  } else {
    auto [bounds, qlen_start] =
        ddtree::launch_sanitize_indptrs(qo_indptr, limits, ddtree::StatusView{nullptr, nullptr},
                                        layout == "qlen" && !args.has_mask_indptr, stream);
    args.qlen_start = qlen_start.defined() ? qlen_start.data_ptr<int64_t>() : nullptr;
    convert_tree_mask_kernel<false><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
        limits, reinterpret_cast<const ddtree::IndptrBounds*>(bounds.data_ptr<int64_t>()), args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return words;
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("convert_tree_mask", &convert_tree_mask_cuda); }
