// Host side of the sm_90a verify kernel: checks, launch on the current stream, op registration
// (torch.ops.ddtree_sm90.tree_attention). Built as its own library (ddtree_op/build.py), so the
// preparation kernels never depend on CUTLASS or on a Hopper GPU; the kernels themselves compile
// in the verify_attention_<dtype>_<schedule>.cu units beside it.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdlib>
#include <string>

#include "../index_view.cuh"
#include "../status.cuh"
#include "../verify_plan.cuh"
#include "verify_launch.cuh"

namespace {

using ddtree::sm90::launch_verify_attention;
using ddtree::sm90::VerifyParams;

// The pool [S, 576] as 64-row x 64-column boxes with the tiles' 128-byte swizzle, so the kernel
// loads a tile of consecutive slots with TMA. False (cp.async only) where the driver or the
// layout does not allow it. The driver entry point is looked up once, without linking libcuda.
bool encode_kv_boxes(CUtensorMap* map, const at::Tensor& kv_cache) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const int64_t rows = kv_cache.size(0), row_bytes = kv_cache.stride(0) * kv_cache.element_size();
  if (encode == nullptr || rows < 1 || rows > (int64_t(1) << 32) - 1 || row_bytes % 16 != 0 || row_bytes >= (int64_t(1) << 40)) {
    return false;
  }
  const cuuint64_t dims[2] = {576, static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {64, 64}, element_strides[2] = {1, 1};
  const auto type = kv_cache.scalar_type() == at::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 2, kv_cache.data_ptr(), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// DDTREE_SM90_TMA=0 turns the TMA tiles off (every tile by cp.async), for A/B timing.
bool kv_boxes_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DDTREE_SM90_TMA");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

// The kernel for q's dtype Element, the schedule and the cache's dtype: an e4m3 cache in the split
// schedule by the transposed kernel unless `widened` (verify_attention_transposed.cuh).
template <class Element>
void launch_for_cache(bool persistent, bool fp8_kv, bool widened, const VerifyParams& params, dim3 grid, cudaStream_t stream) {
  if (fp8_kv && !persistent && !widened) {
    ddtree::sm90::launch_verify_attention_transposed<Element>(params, grid, stream);
  } else if (persistent) {
    fp8_kv ? launch_verify_attention<Element, true, true>(params, grid, stream)
           : launch_verify_attention<Element, true, false>(params, grid, stream);
  } else {
    fp8_kv ? launch_verify_attention<Element, false, true>(params, grid, stream)
           : launch_verify_attention<Element, false, false>(params, grid, stream);
  }
}

void tree_attention_sm90(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& qo_indptr,
                         const at::Tensor& verify_indptr, const at::Tensor& verify_indices,
                         const at::Tensor& mask_words, double sm_scale, at::Tensor& out, at::Tensor& lse,
                         at::Tensor& part_out, at::Tensor& part_lse, int64_t num_splits,
                         int64_t persistent_ctas, const at::Tensor& plan, const c10::optional<at::Tensor>& status,
                         const c10::optional<at::Tensor>& kv_scale, double kv_scale_value, c10::string_view fp8_kernel) {
  const c10::cuda::CUDAGuard guard(q.device());
  TORCH_CHECK(q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1, "ddtree_op: 'q' must be [T, H, 576], last dim contiguous");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf, "ddtree_op: 'q' must be bf16 or fp16");
  const bool fp8_kv = kv_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(kv_cache.dim() == 2 && kv_cache.size(1) == 576 && kv_cache.stride(1) == 1 &&
                  (kv_cache.scalar_type() == q.scalar_type() || fp8_kv),
              "ddtree_op: 'kv_cache' must be [S, 576] rows of q's dtype or of float8_e4m3fn");
  TORCH_CHECK(!kv_scale.has_value() || (fp8_kv && kv_scale->is_cuda() && kv_scale->device() == q.device() &&
                                        kv_scale->scalar_type() == at::kFloat && kv_scale->numel() == 1),
              "ddtree_op: argument 'kv_scale' must be a float32 tensor of one element on the device of q, for a "
              "float8_e4m3fn kv_cache");
  auto aligned16 = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  TORCH_CHECK(aligned16(q) && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0,
              "ddtree_op: argument 'q' must have 16-byte aligned rows for backend 'cutlass' (use backend 'triton')");
  TORCH_CHECK(aligned16(kv_cache) && kv_cache.stride(0) * kv_cache.element_size() % 16 == 0,
              "ddtree_op: argument 'kv_cache' must have 16-byte aligned rows for backend 'cutlass' (use backend 'triton')");
  // The epilogue stores 16-byte pieces of output rows.
  TORCH_CHECK(out.dim() == 3 && out.stride(2) == 1 && aligned16(out) && out.stride(0) % 8 == 0 && out.stride(1) % 8 == 0,
              "ddtree_op: argument 'out' must have 16-byte aligned rows for backend 'cutlass' (use backend 'triton')");
  TORCH_CHECK(verify_indptr.scalar_type() == at::kInt && verify_indices.scalar_type() == at::kInt &&
                  verify_indptr.is_contiguous() && verify_indices.is_contiguous(),
              "ddtree_op: verify_indptr/verify_indices must be contiguous int32");
  TORCH_CHECK(mask_words.scalar_type() == at::kLong && mask_words.dim() == 2 && mask_words.stride(1) == 1,
              "ddtree_op: 'mask_words' must be int64 [T, W]");
  check_index_tensor(qo_indptr, "qo_indptr");
  const std::string kernel_choice(fp8_kernel.data(), fp8_kernel.size());
  TORCH_CHECK(kernel_choice == "auto" || kernel_choice == "transposed" || kernel_choice == "widened",
              "ddtree_op: argument 'fp8_kernel' must be 'auto', 'transposed' or 'widened', not '", kernel_choice, "'");
  TORCH_CHECK(kernel_choice != "transposed" || (fp8_kv && persistent_ctas == 0),
              "ddtree_op: fp8_kernel 'transposed' takes a float8_e4m3fn kv_cache and the split schedule (persistent_ctas 0)");
  TORCH_CHECK(num_splits >= 1, "ddtree_op: num_splits must be >= 1");
  TORCH_CHECK(persistent_ctas >= 0, "ddtree_op: persistent_ctas must be >= 0");
  const int64_t tokens = q.size(0), heads = q.size(1), batch = qo_indptr.numel() - 1;
  // Partial rows: two slots of 64 per CTA (persistent), kPieceSlotsPerSplit * splits slots of
  // T * H (split, with splits).
  const int64_t split_ctas = ddtree::split_grid(tokens, heads, batch, num_splits);
  const bool partials = num_splits > 1 || persistent_ctas > 0;
  const int64_t partial_rows =
      persistent_ctas > 0 ? 2 * persistent_ctas * 64 : ddtree::kPieceSlotsPerSplit * num_splits * tokens * heads;
  TORCH_CHECK(!partials || (part_out.scalar_type() == at::kFloat && part_out.is_contiguous() && part_out.numel() >= partial_rows * 512 &&
                            part_lse.scalar_type() == at::kFloat && part_lse.is_contiguous() && part_lse.numel() >= partial_rows),
              "ddtree_op: 'part_out'/'part_lse' must be contiguous float32 with room for ", partial_rows, " partial rows");
  // The schedule plan (verify_plan.cuh), made for these heads and splits (and, for the persistent
  // kernel, these CTAs): the kernel checks that on the device and reads nothing otherwise.
  TORCH_CHECK(plan.is_cuda() && plan.device() == q.device() && plan.scalar_type() == at::kLong && plan.is_contiguous() &&
                  plan.numel() == ddtree::plan_numel(tokens, heads, batch),
              "ddtree_op: argument 'plan' must be a contiguous int64 tensor of ", ddtree::plan_numel(tokens, heads, batch),
              " entries on the device of q (ddtree::prepare_verify or ddtree_cuda::verify_plan)");
  // The status of the preparation before this launch, which took no ticket (../status.cuh).
  TORCH_CHECK(!status.has_value() || (status->is_cuda() && status->device() == q.device() && status->scalar_type() == at::kInt &&
                                      status->is_contiguous() && status->numel() >= ddtree::kStatusSize),
              "ddtree_op: argument 'status' must be a contiguous int32 tensor of 48 entries on the device of q "
              "(ddtree_op.new_status)");
  static_assert(ddtree::kStatusSize == 48, "the message above says 48");
  if (tokens == 0) return;  // nothing launched: the caller publishes the status

  VerifyParams params{};
  params.q = q.data_ptr();
  params.q_stride_token = q.stride(0);
  params.q_stride_head = q.stride(1);
  params.kv = kv_cache.data_ptr();
  params.kv_boxes = !fp8_kv && kv_boxes_enabled() && encode_kv_boxes(&params.kv_map, kv_cache);  // e4m3: cp.async only
  params.kv_stride = kv_cache.stride(0);
  params.kv_scale = kv_scale.has_value() ? kv_scale->data_ptr<float>() : nullptr;
  params.kv_scale_value = static_cast<float>(kv_scale_value);
  params.qo_indptr = view_of(qo_indptr);
  params.verify_indptr = verify_indptr.data_ptr<int32_t>();
  params.verify_indices = verify_indices.data_ptr<int32_t>();
  params.mask_words = mask_words.data_ptr<int64_t>();
  params.mask_stride = mask_words.stride(0);
  params.out = out.data_ptr();
  params.out_stride_token = out.stride(0);
  params.out_stride_head = out.stride(1);
  params.lse = lse.data_ptr<float>();
  params.lse_stride_token = lse.stride(0);
  params.lse_stride_head = lse.stride(1);
  params.part_out = partials ? part_out.data_ptr<float>() : nullptr;
  params.part_lse = partials ? part_lse.data_ptr<float>() : nullptr;
  params.num_tokens = static_cast<int>(tokens);
  params.heads = static_cast<int>(heads);
  params.batch = static_cast<int>(batch);
  params.num_splits = static_cast<int>(num_splits);
  params.plan = plan.data_ptr<int64_t>();
  params.scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  params.status = ddtree::make_status_view(status.has_value() ? status->data_ptr<int32_t>() : nullptr, false);


  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool persistent = persistent_ctas > 0;
  const dim3 grid(static_cast<unsigned>(persistent ? persistent_ctas : split_ctas));
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  const bool widened = kernel_choice == "widened";
  if (bf16) {
    launch_for_cache<cutlass::bfloat16_t>(persistent, fp8_kv, widened, params, grid, stream);
  } else {
    launch_for_cache<cutlass::half_t>(persistent, fp8_kv, widened, params, grid, stream);
  }
}

}  // namespace

TORCH_LIBRARY(ddtree_sm90, m) {
  m.def(
      "tree_attention(Tensor q, Tensor kv_cache, Tensor qo_indptr, Tensor verify_indptr, Tensor verify_indices,"
      " Tensor mask_words, float sm_scale, Tensor(a!) out, Tensor(b!) lse, Tensor(c!) part_out,"
      " Tensor(d!) part_lse, int num_splits, int persistent_ctas, Tensor plan, Tensor(e!)? status=None,"
      " Tensor? kv_scale=None, float kv_scale_value=1.0, str fp8_kernel='auto') -> ()");
}

TORCH_LIBRARY_IMPL(ddtree_sm90, CUDA, m) { m.impl("tree_attention", &tree_attention_sm90); }
