// Index tensors arrive as int32 or int64 (SGLang mixes both); kernels read either as int64.
#pragma once
#include <ATen/ATen.h>

struct IndexView {
  const void* data;
  bool is64;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is64 ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

// The request that owns position `pos` of a segmented array: the last b in [0, batch) with
// indptr[b] <= pos (binary search; empty requests are skipped over).
template <class Indptr>
__device__ __forceinline__ int owning_request(const Indptr& indptr, int batch, int64_t pos) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;  // no int overflow for any batch
    if (indptr[mid] <= pos) lo = mid; else hi = mid - 1;
  }
  return lo;
}

inline IndexView view_of(const at::Tensor& t) { return {t.data_ptr(), t.scalar_type() == at::kLong}; }

inline void check_index_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.dim() == 1 && t.is_contiguous() && (t.scalar_type() == at::kInt || t.scalar_type() == at::kLong),
              "ddtree_op: argument '", name, "' must be a contiguous 1-D int32/int64 CUDA tensor");
}
