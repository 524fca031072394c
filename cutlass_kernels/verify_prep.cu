// The verify step's preparation in one launch (two above kSharedBatch requests): blocks [0, index_blocks) build the combined
// indices (verify_indices.cuh, one position a thread, or kWidePositions where one a thread would need
// more blocks than the GPU holds at once), the others convert the tree mask
// (tree_mask.cuh, a warp per word). Every block first sanitizes the batch (verify_status.cuh:
// staged indptrs and one block vote, block 0 recording the indptr faults; above kSharedBatch
// requests a one-block pass launched first does that once). The optional status is published by
// the attention launch that follows in the verify step, or, for the op called alone, by the last
// block to finish (status.cuh). Where a plan is asked for, the first plan.blocks blocks write the
// schedule plan of the sanitized batch instead (verify_plan.cuh; first, so that they run in the
// first wave). On the current stream, no host reads: capturable in CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <type_traits>

#include "grid_dependency.cuh"
#include "tree_mask.cuh"
#include "verify_indices.cuh"
#include "verify_plan.cuh"
#include "verify_status.cuh"

namespace {

constexpr int kThreads = 256;
// Three blocks an SM (up to 80 registers a thread): the plan's piece search needs more than 64,
// which spilled in the staged forms.
constexpr int kMinBlocksPerSm = 3;

// kStaged: every block stages the batch (B <= kSharedBatch); else `bounds` holds what
// sanitize_indptrs_kernel found, launched just before on the same stream. kPositions: positions a
// thread of the index build takes.
template <bool kStaged, int kPositions>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) prepare_verify_kernel(ddtree::BatchLimits limits, const ddtree::IndptrBounds* bounds,
                                                                  VerifyIndexArgs index, int index_blocks, TreeMaskArgs mask,
                                                                  ddtree::StatusView view, ddtree::PlanArgs plan) {
  ddtree::PlanClock clock;  // a debug build's (plan_clocks.cuh)
  ddtree::allow_dependent_grids();  // the attention launch may set up; it waits for this grid to finish
  const int block = static_cast<int>(blockIdx.x);
  ddtree::StatusRecorder status(view);
  const auto batch = [&] {
    if constexpr (kStaged) return ddtree::sanitize_staged(limits, status, block == 0);
    else return ddtree::sanitized_from(limits, bounds);
  }();
  const int work_block = block - plan.blocks;
  if (work_block < 0) {
    clock.record_if(block == 0 && threadIdx.x == 0);
    clock.mark(ddtree::kPlanSanitized);
    ddtree::build_verify_plan<kThreads>(plan, batch, block, clock);
  } else if (work_block < index_blocks) {  // block-uniform, so the mask warps below stay whole for their ballots
    build_verify_indices<kPositions>(index, batch, status,
                                     static_cast<int64_t>(work_block) * blockDim.x * kPositions + threadIdx.x, blockDim.x);
  } else {
    const int64_t thread = static_cast<int64_t>(work_block - index_blocks) * blockDim.x + threadIdx.x;
    convert_tree_mask_word(mask, batch, status, thread / 32, threadIdx.x % 32);
  }
  ddtree::finish_status(status);
}

// Blocks of the one-position kernel that the current GPU holds at once (cached per device).
template <bool kStaged>
int64_t resident_blocks() {
  static std::atomic<int64_t> cached[64];  // 0: not yet asked
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 64 && cached[device].load(std::memory_order_relaxed) > 0) return cached[device].load(std::memory_order_relaxed);
  int per_sm = 0, sms = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prepare_verify_kernel<kStaged, 1>, kThreads, 0));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = static_cast<int64_t>(per_sm > 0 ? per_sm : 1) * (sms > 0 ? sms : 1);
  if (device < 64) cached[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

// The status's data, or null without one. Checked before the op makes anything, its message
// literals only: with the size streamed into it, this check crashed the process instead of
// raising (docs/kernel-log.md, "stsm landed, v14 and v14b not").
int32_t* checked_status_data(const c10::optional<at::Tensor>& status, c10::Device device) {
  if (!status.has_value()) return nullptr;
  static_assert(ddtree::kStatusSize == 48, "the message below says 48");
  TORCH_CHECK(status->is_cuda() && status->device() == device && status->scalar_type() == at::kInt &&
                  status->is_contiguous() && status->numel() >= ddtree::kStatusSize,
              "ddtree_op: argument 'status' must be a contiguous int32 tensor of 48 entries on the device of q "
              "(ddtree_op.new_status)");
  return status->data_ptr<int32_t>();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> prepare_verify_cuda(
    const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
    const at::Tensor& out_cache_loc, const at::Tensor& tree_mask, const c10::optional<at::Tensor>& mask_indptr,
    c10::string_view layout, int64_t num_rows, int64_t words_per_row, int64_t num_slots, int64_t max_draft_len,
    const c10::optional<at::Tensor>& status, const c10::optional<at::Tensor>& plan, int64_t heads, int64_t plan_ctas,
    int64_t plan_splits, bool publish_status) {
  int32_t* const status_data = checked_status_data(status, qo_indptr.device());
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  auto [index, verify_indptr, verify_indices] =
      make_verify_index_args(qo_indptr, kv_indptr, kv_indices, out_cache_loc, num_slots);
  auto [mask, words] = make_tree_mask_args(tree_mask, mask_indptr, qo_indptr, kv_indptr, layout, num_rows, words_per_row);
  at::Tensor qo_out = at::empty({qo_indptr.numel()}, qo_indptr.options().dtype(at::kInt));
  index.qo_indptr_out = qo_out.data_ptr<int32_t>();
  const int packed_width = packed_mask_width(tree_mask, layout);
  const auto reads_mask_indptr = packed_width == 0 ? mask_indptr : c10::optional<at::Tensor>();
  const ddtree::BatchLimits limits = ddtree::make_batch_limits(
      qo_indptr, kv_indptr, reads_mask_indptr, num_rows, out_cache_loc.numel(), kv_indices.numel(),
      64 * words_per_row, max_draft_len, packed_width);
  // Without publish_status the attention launch that follows publishes (status.cuh).
  const ddtree::StatusView status_view = ddtree::make_status_view(status_data, publish_status);
  const bool staged = limits.batch <= ddtree::kSharedBatch;
  const bool wide = index.num_blocks(kThreads, 1) > (staged ? resident_blocks<true>() : resident_blocks<false>());
  const int64_t index_blocks = index.num_blocks(kThreads, wide ? kWidePositions : 1);
  const int64_t mask_blocks = (mask.num_words() * 32 + kThreads - 1) / kThreads;
  const ddtree::PlanArgs plan_args =
      ddtree::make_verify_plan_args(plan, qo_indptr.device(), num_rows, heads, limits.batch, plan_ctas, plan_splits, kThreads);
  const int64_t blocks = plan_args.blocks + index_blocks + mask_blocks;
  TORCH_CHECK(blocks <= INT32_MAX, "ddtree_op: the preparation of ", num_rows, " rows and ", index.total,
              " positions needs more than 2^31 - 1 blocks");
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto launch = [&](auto positions) {
    constexpr int kPositions = decltype(positions)::value;
    if (staged) {
      prepare_verify_kernel<true, kPositions><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
          limits, nullptr, index, static_cast<int>(index_blocks), mask, status_view, plan_args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      auto [bounds, qlen_start] =
          ddtree::launch_sanitize_indptrs(qo_indptr, limits, status_view, layout == "qlen" && !mask.has_mask_indptr, stream);
      mask.qlen_start = qlen_start.defined() ? qlen_start.data_ptr<int64_t>() : nullptr;
      prepare_verify_kernel<false, kPositions><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
          limits, reinterpret_cast<const ddtree::IndptrBounds*>(bounds.data_ptr<int64_t>()), index,
          static_cast<int>(index_blocks), mask, status_view, plan_args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  };
  if (wide) launch(std::integral_constant<int, kWidePositions>{});
  else launch(std::integral_constant<int, 1>{});
  return {verify_indptr, verify_indices, words, qo_out};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("prepare_verify", &prepare_verify_cuda); }
