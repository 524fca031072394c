// The schedule plan alone (verify_plan.cuh), for a batch handed to the attention op directly
// rather than through the preparation, or for a schedule other than the one it was made for:
// one launch on the current stream, no host reads, capturable in CUDA graphs. The indptrs are
// read as given (the preparation's are sanitized already).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "index_view.cuh"
#include "verify_plan.cuh"

namespace {

constexpr int kThreads = 256;

struct GivenBatch {
  IndexView qo;
  const int32_t* verify_indptr;
  __device__ __forceinline__ int64_t num_draft(int b) const { return qo[b + 1] - qo[b]; }
  __device__ __forceinline__ int64_t keys_before(int b) const { return verify_indptr[b]; }
};

__global__ void __launch_bounds__(kThreads) verify_plan_kernel(ddtree::PlanArgs args, GivenBatch batch) {
  ddtree::PlanClock clock;  // a debug build's (plan_clocks.cuh): no sanitizing here
  clock.record_if(blockIdx.x == 0 && threadIdx.x == 0);
  clock.mark(ddtree::kPlanSanitized);
  ddtree::build_verify_plan<kThreads>(args, batch, static_cast<int>(blockIdx.x), clock);
}

at::Tensor verify_plan_cuda(const at::Tensor& qo_indptr, const at::Tensor& verify_indptr, int64_t num_rows, int64_t heads,
                            int64_t ctas, int64_t splits) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  check_index_tensor(qo_indptr, "qo_indptr");
  TORCH_CHECK(qo_indptr.numel() >= 1 && verify_indptr.is_cuda() && verify_indptr.scalar_type() == at::kInt &&
                  verify_indptr.is_contiguous() && verify_indptr.numel() >= qo_indptr.numel(),
              "ddtree_op: verify_indptr must be contiguous int32 with B+1 entries");
  const int64_t batch = qo_indptr.numel() - 1;
  at::Tensor plan = at::empty({ddtree::plan_numel(num_rows, heads, batch)}, qo_indptr.options().dtype(at::kLong));
  const ddtree::PlanArgs args =
      ddtree::make_verify_plan_args(plan, qo_indptr.device(), num_rows, heads, batch, ctas, splits, kThreads);
  verify_plan_kernel<<<args.blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      args, GivenBatch{view_of(qo_indptr), verify_indptr.data_ptr<int32_t>()});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return plan;
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("verify_plan", &verify_plan_cuda); }
