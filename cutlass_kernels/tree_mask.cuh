// Compact tree mask: int64 [num_rows, words_per_row]; bit j of word w in row t says that draft
// row t sees draft column 64*w + j of its own request. Layouts as in SGLang:
//   full   - request b's block is [n, P + n] bytes at mask_indptr[b]; draft column j at P + j
//   qlen   - request b's block is [n, n] bytes at mask_indptr[b] (or the sum of earlier n^2)
//   packed - one integer per draft row at index qo_indptr[b] + i, bit j = sees draft j
// The per-word step (one warp per word), shared by the conversion kernel (tree_mask.cu) and the
// fused preparation kernel (verify_prep.cu).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "index_view.cuh"

enum class MaskLayout : int { kFull = 0, kQlen = 1, kPacked = 2 };

struct TreeMaskArgs {
  const uint8_t* mask;
  int64_t mask_numel;
  int packed_bytes;
  IndexView mask_indptr;
  bool has_mask_indptr;
  IndexView qo_indptr, kv_indptr;
  int batch;
  MaskLayout layout;
  int64_t num_rows;
  int words_per_row;
  int64_t* words;
  int64_t num_words() const { return num_rows * words_per_row; }
};

// The whole warp calls this with the same word index `idx`: lane j reads bytes j and 32 + j of
// the row's 64-column window (coalesced) and two ballots make the word.
__device__ __forceinline__ void convert_tree_mask_word(const TreeMaskArgs& a, int64_t idx, int lane) {
  if (idx >= a.num_rows * a.words_per_row) return;  // warp-uniform
  const int64_t row = idx / a.words_per_row;
  const int word = static_cast<int>(idx % a.words_per_row);
  uint64_t bits = 0;
  if (a.batch > 0 && row >= a.qo_indptr[0] && row < a.qo_indptr[a.batch]) {
    const int b = owning_request(a.qo_indptr, a.batch, row);
    const int64_t draft_row = row - a.qo_indptr[b];
    const int64_t num_draft = a.qo_indptr[b + 1] - a.qo_indptr[b];
    const int64_t col0 = static_cast<int64_t>(word) * 64;
    const int64_t remaining = num_draft - col0;
    const int count = remaining >= 64 ? 64 : static_cast<int>(remaining);
    if (count > 0) {
      if (a.layout == MaskLayout::kPacked) {
        if (word == 0 && row < a.mask_numel) {
          uint64_t raw = 0;
          for (int k = 0; k < a.packed_bytes; ++k) raw |= static_cast<uint64_t>(a.mask[row * a.packed_bytes + k]) << (8 * k);
          bits = count >= 64 ? raw : raw & ((uint64_t{1} << count) - 1);
        }
      } else {
        int64_t start;
        if (a.layout == MaskLayout::kFull) {
          const int64_t prefix_len = a.kv_indptr[b + 1] - a.kv_indptr[b];
          start = a.mask_indptr[b] + draft_row * (prefix_len + num_draft) + prefix_len + col0;
        } else {
          int64_t block = 0;
          if (a.has_mask_indptr) {
            block = a.mask_indptr[b];
          } else {
            for (int e = 0; e < b; ++e) {
              const int64_t n = a.qo_indptr[e + 1] - a.qo_indptr[e];
              block += n * n;
            }
          }
          start = block + draft_row * num_draft + col0;
        }
        auto sees = [&](int j) {
          const int64_t at = start + j;
          return j < count && at >= 0 && at < a.mask_numel && a.mask[at] != 0;
        };
        const uint32_t low = __ballot_sync(0xffffffffu, sees(lane));
        const uint32_t high = __ballot_sync(0xffffffffu, sees(32 + lane));
        bits = static_cast<uint64_t>(low) | (static_cast<uint64_t>(high) << 32);
      }
    }
  }
  if (lane == 0) a.words[idx] = static_cast<int64_t>(bits);
}

// Checks the arguments, allocates the words [num_rows, words_per_row] (int64).
inline std::tuple<TreeMaskArgs, at::Tensor> make_tree_mask_args(const at::Tensor& tree_mask,
                                                                const c10::optional<at::Tensor>& mask_indptr,
                                                                const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                                                c10::string_view layout, int64_t num_rows,
                                                                int64_t words_per_row) {
  MaskLayout kind;
  if (layout == "full") kind = MaskLayout::kFull;
  else if (layout == "qlen") kind = MaskLayout::kQlen;
  else if (layout == "packed") kind = MaskLayout::kPacked;
  else TORCH_CHECK(false, "ddtree_op: argument 'mask_layout' must be full, qlen or packed, got ", layout);
  TORCH_CHECK(tree_mask.is_cuda() && tree_mask.is_contiguous(), "ddtree_op: 'tree_mask' must be a contiguous CUDA tensor");
  TORCH_CHECK(kind != MaskLayout::kFull || mask_indptr.has_value(), "ddtree_op: 'mask_indptr' is required for layout full");
  check_index_tensor(qo_indptr, "qo_indptr");
  check_index_tensor(kv_indptr, "kv_indptr");
  const bool has_mask_indptr = mask_indptr.has_value();
  if (has_mask_indptr) check_index_tensor(*mask_indptr, "mask_indptr");
  at::Tensor words = at::empty({num_rows, words_per_row}, qo_indptr.options().dtype(at::kLong));
  const TreeMaskArgs args{static_cast<const uint8_t*>(tree_mask.data_ptr()),
                          tree_mask.numel(),
                          static_cast<int>(tree_mask.element_size()),
                          has_mask_indptr ? view_of(*mask_indptr) : view_of(qo_indptr),
                          has_mask_indptr,
                          view_of(qo_indptr),
                          view_of(kv_indptr),
                          static_cast<int>(qo_indptr.numel() - 1),
                          kind,
                          num_rows,
                          static_cast<int>(words_per_row),
                          words.data_ptr<int64_t>()};
  return {args, words};
}
