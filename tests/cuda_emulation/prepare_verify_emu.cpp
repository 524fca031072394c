// The fused preparation kernel (cutlass_kernels/verify_prep.cu: its host side and kernel body, over
// CPU tensors) built for the host against the real headers, launched through cuda_shim.h. Batches
// above kSharedBatch run the unstaged pass first, as on the GPU; `force_unstaged` takes that path
// for any batch, so that both paths can be compared on the same inputs. `last_block_publishes`:
// the preparation op alone (the ticket); else the verify step's way: the preparation takes no
// ticket and one thread of a launch after it publishes (the attention kernels' publish_status).
#include "cuda_shim.h"
#include <torch/extension.h>
#include "tree_mask.cuh"
#include "verify_indices.cuh"
#include "verify_status.cuh"

// verify_prep.cu's host side and kernel, over CPU tensors.
std::vector<at::Tensor> prepare_verify_emu(at::Tensor qo_indptr, at::Tensor kv_indptr, at::Tensor kv_indices,
                                           at::Tensor out_cache_loc, at::Tensor tree_mask, c10::optional<at::Tensor> mask_indptr,
                                           std::string layout_s, int64_t num_rows, int64_t words_per_row, int64_t num_slots,
                                           int64_t max_draft_len, c10::optional<at::Tensor> status, bool force_unstaged,
                                           int64_t positions_per_thread, bool last_block_publishes) {
  constexpr int kThreads = 256;
  c10::string_view layout(layout_s);
  const int batch = static_cast<int>(qo_indptr.numel() - 1);
  const int64_t total = kv_indices.numel() + out_cache_loc.numel();
  auto opts = qo_indptr.options().dtype(at::kInt);
  at::Tensor verify_indptr = at::empty({batch + 1}, opts), verify_indices = at::empty({total}, opts);
  at::Tensor qo_out = at::empty({batch + 1}, opts);
  VerifyIndexArgs index{view_of(kv_indices), view_of(out_cache_loc), batch, total, num_slots,
                        verify_indptr.data_ptr<int32_t>(), verify_indices.data_ptr<int32_t>(), qo_out.data_ptr<int32_t>()};
  MaskLayout kind = layout == "full" ? MaskLayout::kFull : layout == "qlen" ? MaskLayout::kQlen : MaskLayout::kPacked;
  at::Tensor words = at::empty({num_rows, words_per_row}, qo_indptr.options().dtype(at::kLong));
  const bool has_mi = mask_indptr.has_value();
  TreeMaskArgs mask{static_cast<const uint8_t*>(tree_mask.data_ptr()), tree_mask.numel(), static_cast<int>(tree_mask.element_size()),
                    has_mi ? view_of(*mask_indptr) : view_of(qo_indptr), has_mi, nullptr, batch, kind,
                    num_rows, static_cast<int>(words_per_row), words.data_ptr<int64_t>()};
  const int packed_width = packed_mask_width(tree_mask, layout);
  const auto reads = packed_width == 0 ? mask_indptr : c10::optional<at::Tensor>();
  const ddtree::BatchLimits limits = ddtree::make_batch_limits(qo_indptr, kv_indptr, reads, num_rows, out_cache_loc.numel(),
                                                               kv_indices.numel(), 64 * words_per_row, max_draft_len, packed_width);
  const ddtree::StatusView sv =
      ddtree::make_status_view(status.has_value() ? status->data_ptr<int32_t>() : nullptr, last_block_publishes);
  // The GPU's choice depends on its size: both widths are emulated, as the caller asks.
  TORCH_CHECK(positions_per_thread == 1 || positions_per_thread == kWidePositions, "positions_per_thread: 1 or kWidePositions");
  const int64_t index_blocks = index.num_blocks(kThreads, static_cast<int>(positions_per_thread));
  const int64_t mask_blocks = (mask.num_words() * 32 + kThreads - 1) / kThreads;
  const int ib = static_cast<int>(index_blocks);
  const int grid = static_cast<int>(index_blocks + mask_blocks);
  // prepare_verify_kernel's body, with the batch from `sanitized(recorder, block)`.
  auto launch_prepare = [&](auto sanitized) {
    emu_launch(grid, kThreads, [&] {
      const int block = static_cast<int>(blockIdx.x);
      ddtree::StatusRecorder rec(sv);
      const auto b = sanitized(rec, block);
      if (block < ib) {
        const int64_t first = static_cast<int64_t>(block) * blockDim.x * positions_per_thread + threadIdx.x;
        if (positions_per_thread == 1) build_verify_indices<1>(index, b, rec, first, blockDim.x);
        else build_verify_indices<kWidePositions>(index, b, rec, first, blockDim.x);
      } else {
        const int64_t thread = static_cast<int64_t>(block - ib) * blockDim.x + threadIdx.x;
        convert_tree_mask_word(mask, b, rec, thread / 32, threadIdx.x % 32);
      }
      ddtree::finish_status(rec);
    });
  };
  if (batch <= ddtree::kSharedBatch && !force_unstaged) {
    launch_prepare([&](ddtree::StatusRecorder& rec, int block) { return ddtree::sanitize_staged(limits, rec, block == 0); });
  } else {
    ddtree::IndptrBounds bounds{};
    at::Tensor starts = layout == "qlen" && !has_mi ? at::empty({batch}, qo_indptr.options().dtype(at::kLong)) : at::Tensor();
    int64_t* starts_ptr = starts.defined() ? starts.data_ptr<int64_t>() : nullptr;
    // Fewer threads than the GPU's kSanitizeThreads, so that small batches take several rounds
    // of its loops (entries, scan tiles) and its reduction spans several warps.
    constexpr int kEmuSanitizeThreads = 64;
    emu_launch(1, kEmuSanitizeThreads, [&] {
      ddtree::sanitize_indptrs_kernel<kEmuSanitizeThreads>(limits, sv, &bounds, starts_ptr);
    });
    mask.qlen_start = starts_ptr;
    launch_prepare([&](ddtree::StatusRecorder&, int) { return ddtree::sanitized_from(limits, &bounds); });
  }
  if (sv.data != nullptr && !last_block_publishes) {
    emu_launch(1, 1, [&] { ddtree::publish_status(sv); });  // the attention launch's publishing thread
  }
  return {verify_indptr, verify_indices, words, qo_out};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("prepare_verify_emu", &prepare_verify_emu); }
