// The paged batch in slot lists (paged_indices.cuh has the layout): one launch on the current
// stream (two for batches above kPagedSharedBatch), no host reads, so it is capturable in CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "paged_indices.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kStagedItems = (kPagedSharedBatch + kThreads) / kThreads;  // B + 1 entries: one tile
constexpr int kScanThreads = 512;
constexpr int kScanItems = 8;
// The slot threads stride over the entries: the prefix bound from shapes (every table row full)
// is usually far above the positions in use, and a block per 256 of it would mostly exit at once.
constexpr int64_t kMaxSlotBlocks = 2048;

__global__ void __launch_bounds__(kScanThreads) scan_paged_lengths_kernel(PagedLengthArgs args) {
  scan_paged_lengths<kScanThreads, kScanItems>(args);
}

__device__ __forceinline__ void write_paged_slots(const PagedSlotArgs& args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t end = args.prefix_entries + args.num_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
    write_paged_slot(args, i);
  }
}

// After scan_paged_lengths_kernel (batches above kPagedSharedBatch): lengths from global memory.
__global__ void __launch_bounds__(kThreads) paged_slots_kernel(PagedSlotArgs args) { write_paged_slots(args); }

// Every block scans the lengths into shared memory (a few loads it would otherwise make from the
// scan's output anyway) instead of waiting for a separate scan launch; block 0 also stores
// kv_indptr, which the preparation reads.
__global__ void __launch_bounds__(kThreads) paged_scan_and_slots_kernel(PagedLengthArgs lengths, PagedSlotArgs slots) {
  __shared__ int32_t s_qo[kPagedSharedBatch + 1], s_kv_indptr[kPagedSharedBatch + 1];
  PagedLengthArgs scan = lengths;
  scan.qo = s_qo;
  scan.kv_indptr = s_kv_indptr;
  scan_paged_lengths<kThreads, kStagedItems>(scan);  // ends with a block barrier
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e <= lengths.batch; e += blockDim.x) lengths.kv_indptr[e] = s_kv_indptr[e];
  }
  PagedSlotArgs local = slots;
  local.qo = s_qo;
  local.kv_indptr = s_kv_indptr;
  write_paged_slots(local);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> paged_slot_lists_cuda(const at::Tensor& block_table,
                                                                     const at::Tensor& cache_seqlens,
                                                                     const at::Tensor& qo_indptr, int64_t page_size,
                                                                     int64_t num_pages, int64_t num_rows) {
  const c10::cuda::CUDAGuard guard(qo_indptr.device());
  TORCH_CHECK(qo_indptr.dim() == 1 && qo_indptr.numel() >= 1, "ddtree_op: qo_indptr must be 1-D of length B+1");
  const int batch = static_cast<int>(qo_indptr.numel() - 1);
  TORCH_CHECK(block_table.is_cuda() && block_table.dim() == 2 && block_table.size(0) >= batch &&
                  block_table.stride(1) == 1 && (block_table.scalar_type() == at::kInt || block_table.scalar_type() == at::kLong),
              "ddtree_op: argument 'block_table' must be a 2-D int32/int64 CUDA tensor with >= B rows, contiguous rows");
  TORCH_CHECK(cache_seqlens.numel() >= batch, "ddtree_op: argument 'cache_seqlens' must have >= B entries");
  TORCH_CHECK(page_size > 0 && num_pages >= 0 && num_rows >= 0, "ddtree_op: page_size must be positive");
  check_index_tensor(qo_indptr, "qo_indptr");
  check_index_tensor(cache_seqlens, "cache_seqlens");
  const int64_t capacity = block_table.size(1) * page_size;
  const int64_t prefix_entries = batch * capacity;  // ddtree_op/prep.py: paged_slot_lists
  TORCH_CHECK(prefix_entries + num_rows < (int64_t{1} << 31) && num_pages * page_size < (int64_t{1} << 31),
              "ddtree_op: a paged batch of ", prefix_entries + num_rows, " positions (pool of ", num_pages * page_size,
              " rows) needs 32-bit indices");

  const auto opts = qo_indptr.options().dtype(at::kInt);
  at::Tensor qo = at::empty({batch + 1}, opts);
  at::Tensor kv_indptr = at::empty({batch + 1}, opts);
  at::Tensor kv_indices = at::empty({prefix_entries}, opts);
  at::Tensor out_cache_loc = at::empty({num_rows}, opts);
  const auto stream = c10::cuda::getCurrentCUDAStream();

  const PagedLengthArgs lengths{view_of(qo_indptr), view_of(cache_seqlens), batch, num_rows, capacity,
                                qo.data_ptr<int32_t>(), kv_indptr.data_ptr<int32_t>()};
  const PagedSlotArgs slots{view_of(block_table), block_table.stride(0), view_of(cache_seqlens), qo.data_ptr<int32_t>(),
                            kv_indptr.data_ptr<int32_t>(), batch, num_rows, page_size, num_pages, capacity, prefix_entries,
                            kv_indices.data_ptr<int32_t>(), out_cache_loc.data_ptr<int32_t>()};
  const int64_t entries = prefix_entries + num_rows;
  const int64_t blocks = std::max<int64_t>(1, std::min(kMaxSlotBlocks, (entries + kThreads - 1) / kThreads));
  if (batch <= kPagedSharedBatch) {
    paged_scan_and_slots_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(lengths, slots);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    scan_paged_lengths_kernel<<<1, kScanThreads, 0, stream>>>(lengths);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    paged_slots_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(slots);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {kv_indptr, kv_indices, out_cache_loc};
}

}  // namespace

TORCH_LIBRARY_IMPL(ddtree_cuda, CUDA, m) { m.impl("paged_slot_lists", &paged_slot_lists_cuda); }
