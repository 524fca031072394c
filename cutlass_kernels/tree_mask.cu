// Compact tree mask: int64 [num_rows, words_per_row]; bit j of word w in row t says that draft
// row t sees draft column 64*w + j of its own request. One warp per (row, word): lane j reads
// bytes j and 32 + j of the row's 64-column window (coalesced) and two ballots make the word.
// One launch on the current stream, no host reads: capturable in CUDA graphs. Layouts as in SGLang:
//   full   - request b's block is [n, P + n] bytes at mask_indptr[b]; draft column j at P + j
//   qlen   - request b's block is [n, n] bytes at mask_indptr[b] (or the sum of earlier n^2)
//   packed - one integer per draft row at index qo_indptr[b] + i, bit j = sees draft j
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "index_view.cuh"

namespace {

enum class MaskLayout : int { kFull = 0, kQlen = 1, kPacked = 2 };

constexpr int kThreads = 256;

__global__ void convert_tree_mask_kernel(const uint8_t* __restrict__ mask, int64_t mask_numel, int packed_bytes,
                                         IndexView mask_indptr, bool has_mask_indptr, IndexView qo_indptr,
                                         IndexView kv_indptr, int batch, MaskLayout layout, int64_t num_rows,
                                         int words_per_row, int64_t* __restrict__ words) {
  const int lane = threadIdx.x % 32;
  const int64_t idx = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // one warp per word
  if (idx >= num_rows * words_per_row) return;  // warp-uniform
  const int64_t row = idx / words_per_row;
  const int word = static_cast<int>(idx % words_per_row);
  uint64_t bits = 0;
  if (batch > 0 && row >= qo_indptr[0] && row < qo_indptr[batch]) {
    const int b = owning_request(qo_indptr, batch, row);
    const int64_t draft_row = row - qo_indptr[b];
    const int64_t num_draft = qo_indptr[b + 1] - qo_indptr[b];
    const int64_t col0 = static_cast<int64_t>(word) * 64;
    const int64_t remaining = num_draft - col0;
    const int count = remaining >= 64 ? 64 : static_cast<int>(remaining);
    if (count > 0) {
      if (layout == MaskLayout::kPacked) {
        if (word == 0 && row < mask_numel) {
          uint64_t raw = 0;
          for (int k = 0; k < packed_bytes; ++k) raw |= static_cast<uint64_t>(mask[row * packed_bytes + k]) << (8 * k);
          bits = count >= 64 ? raw : raw & ((uint64_t{1} << count) - 1);
        }
      } else {
        int64_t start;
        if (layout == MaskLayout::kFull) {
          const int64_t prefix_len = kv_indptr[b + 1] - kv_indptr[b];
          start = mask_indptr[b] + draft_row * (prefix_len + num_draft) + prefix_len + col0;
        } else {
          int64_t block = 0;
          if (has_mask_indptr) {
            block = mask_indptr[b];
          } else {
            for (int e = 0; e < b; ++e) {
              const int64_t n = qo_indptr[e + 1] - qo_indptr[e];
              block += n * n;
            }
          }
          start = block + draft_row * num_draft + col0;
        }
        auto sees = [&](int j) {
          const int64_t at = start + j;
          return j < count && at >= 0 && at < mask_numel && mask[at] != 0;
        };
        const uint32_t low = __ballot_sync(0xffffffffu, sees(lane));
        const uint32_t high = __ballot_sync(0xffffffffu, sees(32 + lane));
        bits = static_cast<uint64_t>(low) | (static_cast<uint64_t>(high) << 32);
      }
    }
  }
  if (lane == 0) words[idx] = static_cast<int64_t>(bits);
}

at::Tensor convert_tree_mask_cuda(const at::Tensor& tree_mask, const c10::optional<at::Tensor>& mask_indptr,
                                  const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, c10::string_view layout,
                                  int64_t num_rows, int64_t words_per_row) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  MaskLayout kind;
  if (layout == "full") kind = MaskLayout::kFull;
  else if (layout == "qlen") kind = MaskLayout::kQlen;
  else if (layout == "packed") kind = MaskLayout::kPacked;
  else TORCH_CHECK(false, "ddtree_op: argument 'mask_layout' must be full, qlen or packed, got ", layout);
  TORCH_CHECK(tree_mask.is_cuda() && tree_mask.is_contiguous(), "ddtree_op: 'tree_mask' must be a contiguous CUDA tensor");
  TORCH_CHECK(kind != MaskLayout::kFull || mask_indptr.has_value(), "ddtree_op: 'mask_indptr' is required for layout full");
  check_index_tensor(qo_indptr, "qo_indptr");
  check_index_tensor(kv_indptr, "kv_indptr");
  const int batch = static_cast<int>(qo_indptr.numel() - 1);
  const bool has_mask_indptr = mask_indptr.has_value();
  if (has_mask_indptr) check_index_tensor(*mask_indptr, "mask_indptr");
  const IndexView mask_indptr_view = has_mask_indptr ? view_of(*mask_indptr) : view_of(qo_indptr);
  const int packed_bytes = static_cast<int>(tree_mask.element_size());
  const int64_t mask_numel = tree_mask.numel();
  at::Tensor words = at::empty({num_rows, words_per_row}, qo_indptr.options().dtype(at::kLong));
  const int64_t total = num_rows * words_per_row;
  if (total == 0) return words;
  const int64_t threads = total * 32;  // a warp per word
  const int blocks = static_cast<int>((threads + kThreads - 1) / kThreads);
  convert_tree_mask_kernel<<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const uint8_t*>(tree_mask.data_ptr()), mask_numel, packed_bytes, mask_indptr_view, has_mask_indptr,
      view_of(qo_indptr), view_of(kv_indptr), batch, kind, num_rows, static_cast<int>(words_per_row),
      words.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return words;
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("convert_tree_mask", &convert_tree_mask_cuda); }
