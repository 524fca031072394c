// Schemas of the compiled library's ops (torch.ops.ddtree_cuda.*). The public ops live in the
// Python-defined namespace `ddtree`; their CUDA implementations call these.
#include <torch/library.h>

TORCH_LIBRARY(ddtree_cuda, m) {
  m.def(
      "build_verify_indices(Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc)"
      " -> (Tensor verify_indptr, Tensor verify_indices)");
  m.def(
      "convert_tree_mask(Tensor tree_mask, Tensor? mask_indptr, Tensor qo_indptr, Tensor kv_indptr, str layout,"
      " int num_rows, int words_per_row) -> Tensor");
  m.def(
      "prepare_verify(Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc, Tensor tree_mask,"
      " Tensor? mask_indptr, str layout, int num_rows, int words_per_row, int num_slots, int max_draft_len,"
      " Tensor(a!)? status, Tensor(b!)? plan, int heads, int plan_ctas, int plan_splits, bool publish_status)"
      " -> (Tensor verify_indptr, Tensor verify_indices, Tensor mask_words, Tensor qo_indptr_out)");
  // The sm90 kernels' schedule plan alone (verify_plan.cu), for indptrs the preparation did not make.
  m.def("verify_plan(Tensor qo_indptr, Tensor verify_indptr, int num_rows, int heads, int ctas, int splits) -> Tensor");
  m.def(
      "paged_slot_lists(Tensor block_table, Tensor cache_seqlens, Tensor qo_indptr, int page_size, int num_pages,"
      " int num_rows) -> (Tensor kv_indptr, Tensor kv_indices, Tensor out_cache_loc)");
}
