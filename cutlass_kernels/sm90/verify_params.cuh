// What the host passes the sm_90a verify kernels (verify_attention.cuh): a header of its own, so
// that the host side (tree_attention_sm90.cu) compiles without the kernel.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "../index_view.cuh"
#include "../status.cuh"

namespace ddtree::sm90 {

struct VerifyParams {
  CUtensorMap kv_map;  // kv as 64-row x 64-column boxes (tree_attention_sm90.cu); valid if kv_boxes
  bool kv_boxes;
  const void* q;
  int64_t q_stride_token, q_stride_head;
  const void* kv;  // rows of q's dtype, or of e4m3 bytes (the kernel's kFp8Kv)
  int64_t kv_stride;  // elements
  // An e4m3 cache's scale (value = stored x scale): *kv_scale, read on the device, or
  // kv_scale_value where kv_scale is nullptr.
  const float* kv_scale;
  float kv_scale_value;
  IndexView qo_indptr;
  const int32_t* verify_indptr;
  const int32_t* verify_indices;  // slot ids; < 0: no slot (the key is invisible)
  const int64_t* mask_words;
  int64_t mask_stride;
  void* out;
  int64_t out_stride_token, out_stride_head;
  float* lse;
  int64_t lse_stride_token, lse_stride_head;
  float* part_out;  // [kPieceSlotsPerSplit * splits, T * H, 512] when splits > 1
  float* part_lse;  // [kPieceSlotsPerSplit * splits, T * H]
  int num_tokens, heads, batch, num_splits;
  const int64_t* plan;  // the schedule plan (../verify_plan.cuh), made for these heads, CTAs and splits
  // Persistent kernel (grid = CTAs): part_out is [2 * CTAs, 64, 512] and part_lse [2 * CTAs, 64],
  // num_splits the pieces schedule's splits per row block (persistent_plan.cuh).
  float scale_log2;  // sm_scale * log2(e)
  StatusView status;  // data nullptr: no status to publish
};

}  // namespace ddtree::sm90
