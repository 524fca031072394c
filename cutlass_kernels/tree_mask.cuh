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
#include "verify_status.cuh"

enum class MaskLayout : int { kFull = 0, kQlen = 1, kPacked = 2 };

struct TreeMaskArgs {
  const uint8_t* mask;
  int64_t mask_numel;
  int packed_bytes;
  IndexView mask_indptr;
  bool has_mask_indptr;
  const int64_t* qlen_start;  // qlen without mask_indptr, unstaged batch: block starts [B] (else nullptr)
  int batch;
  MaskLayout layout;
  int64_t num_rows;
  int words_per_row;
  int64_t* words;
  int64_t num_words() const { return num_rows * words_per_row; }
};

template <class Batch>
struct RowsOf {
  const Batch* s;
  __device__ __forceinline__ int64_t operator[](int64_t b) const { return s->qo_at(static_cast<int>(b)); }
};

// The whole warp calls this with the same word index `idx`: lane j reads bytes j and 32 + j of
// the row's 64-column window (coalesced) and two ballots make the word. Rows are those of the
// sanitized batch view (verify_status.cuh, staged or not); a cell outside the mask
// reads as "not visible" and records a fault for its request.
template <class Batch>
__device__ __forceinline__ void convert_tree_mask_word(const TreeMaskArgs& a, const Batch& s, ddtree::StatusRecorder& status,
                                                       int64_t idx, int lane) {
  if (idx >= a.num_rows * a.words_per_row) return;  // warp-uniform
  const int64_t row = idx / a.words_per_row;
  const int word = static_cast<int>(idx % a.words_per_row);
  const RowsOf<Batch> rows{&s};
  uint64_t bits = 0;
  bool outside = false;
  if (a.batch > 0 && row < rows[a.batch]) {
    const int b = owning_request(rows, a.batch, row);
    const int64_t draft_row = row - rows[b];
    const int64_t num_draft = s.num_draft(b);
    const int64_t col0 = static_cast<int64_t>(word) * 64;
    const int64_t remaining = num_draft - col0;
    const int count = remaining >= 64 ? 64 : static_cast<int>(remaining);
    if (count > 0 && !s.is_void(b)) {
      if (a.layout == MaskLayout::kPacked) {
        if (word == 0) {
          if (row < a.mask_numel) {
            uint64_t raw = 0;
            for (int k = 0; k < a.packed_bytes; ++k) raw |= static_cast<uint64_t>(a.mask[row * a.packed_bytes + k]) << (8 * k);
            bits = count >= 64 ? raw : raw & ((uint64_t{1} << count) - 1);
          } else {
            outside = true;
          }
        }
      } else {
        uint64_t start;  // unsigned: any offset wraps instead of overflowing, and one compare bounds it
        if (a.layout == MaskLayout::kFull) {
          const int64_t prefix_len = s.prefix_len(b);
          start = static_cast<uint64_t>(a.mask_indptr[b]) + static_cast<uint64_t>(draft_row * (prefix_len + num_draft) + prefix_len + col0);
        } else {
          uint64_t block = 0;
          if (a.has_mask_indptr) {
            block = static_cast<uint64_t>(a.mask_indptr[b]);
          } else if (a.qlen_start != nullptr) {
            block = static_cast<uint64_t>(a.qlen_start[b]);
          } else {  // a staged batch: at most kSharedBatch requests, in shared memory
            for (int e = 0; e < b; ++e) {
              const int64_t n = s.num_draft(e);
              block += static_cast<uint64_t>(n * n);
            }
          }
          start = block + static_cast<uint64_t>(draft_row * num_draft + col0);
        }
        const uint64_t numel = static_cast<uint64_t>(a.mask_numel);
        auto inside = [&](int j) { return j >= count || start + j < numel; };
        auto sees = [&](int j) { return j < count && start + j < numel && a.mask[start + j] != 0; };
        const uint32_t low = __ballot_sync(0xffffffffu, sees(lane));
        const uint32_t high = __ballot_sync(0xffffffffu, sees(32 + lane));
        outside = !__all_sync(0xffffffffu, inside(lane) && inside(32 + lane));
        bits = static_cast<uint64_t>(low) | (static_cast<uint64_t>(high) << 32);
      }
      if (outside && lane == 0) status.record(ddtree::kMaskRange, b, a.mask_numel);
    }
  }
  if (lane == 0) a.words[idx] = static_cast<int64_t>(bits);
}

// Bits per row of a packed mask, 0 for the byte layouts.
inline int packed_mask_width(const at::Tensor& tree_mask, c10::string_view layout) {
  return layout == "packed" ? static_cast<int>(tree_mask.element_size() * 8) : 0;
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
  if (has_mask_indptr) {
    check_index_tensor(*mask_indptr, "mask_indptr");
    TORCH_CHECK(mask_indptr->numel() >= qo_indptr.numel(), "ddtree_op: argument 'mask_indptr' must have at least B+1 entries");
  }
  at::Tensor words = at::empty({num_rows, words_per_row}, qo_indptr.options().dtype(at::kLong));
  const TreeMaskArgs args{static_cast<const uint8_t*>(tree_mask.data_ptr()),
                          tree_mask.numel(),
                          static_cast<int>(tree_mask.element_size()),
                          has_mask_indptr ? view_of(*mask_indptr) : view_of(qo_indptr),
                          has_mask_indptr,
                          nullptr,
                          static_cast<int>(qo_indptr.numel() - 1),
                          kind,
                          num_rows,
                          static_cast<int>(words_per_row),
                          words.data_ptr<int64_t>()};
  return {args, words};
}
