// The verify step's preparation in one launch: blocks [0, index_blocks) build the combined
// indices (verify_indices.cuh, a thread per position), the others convert the tree mask
// (tree_mask.cuh, a warp per word). Same outputs as the two separate ops, one launch fewer on
// every verify step. On the current stream, no host reads: capturable in CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "tree_mask.cuh"
#include "verify_indices.cuh"

namespace {

constexpr int kThreads = 256;

__global__ void prepare_verify_kernel(VerifyIndexArgs index, int index_blocks, TreeMaskArgs mask) {
  const int block = static_cast<int>(blockIdx.x);
  if (block < index_blocks) {  // block-uniform, so the mask warps below stay whole for their ballots
    build_verify_index(index, static_cast<int64_t>(block) * blockDim.x + threadIdx.x);
  } else {
    const int64_t thread = static_cast<int64_t>(block - index_blocks) * blockDim.x + threadIdx.x;
    convert_tree_mask_word(mask, thread / 32, threadIdx.x % 32);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> prepare_verify_cuda(
    const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
    const at::Tensor& out_cache_loc, const at::Tensor& tree_mask, const c10::optional<at::Tensor>& mask_indptr,
    c10::string_view layout, int64_t num_rows, int64_t words_per_row) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  auto [index, verify_indptr, verify_indices] = make_verify_index_args(qo_indptr, kv_indptr, kv_indices, out_cache_loc);
  auto [mask, words] = make_tree_mask_args(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row);
  const int64_t index_blocks = (index.num_threads() + kThreads - 1) / kThreads;
  const int64_t mask_blocks = (mask.num_words() * 32 + kThreads - 1) / kThreads;
  prepare_verify_kernel<<<static_cast<int>(index_blocks + mask_blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      index, static_cast<int>(index_blocks), mask);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {verify_indptr, verify_indices, words};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("prepare_verify", &prepare_verify_cuda); }
