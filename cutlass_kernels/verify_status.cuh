// Bounds safety of the preparation launch: the per-block view of a sanitized batch that every
// preparation thread reads instead of raw indptrs, and where the indptr faults are recorded into
// the status (status.cuh).
//
// Sanitizing (the CPU twin is ddtree_op's prep module; both must agree bit for bit):
// - qo_indptr is trusted up to its first bad entry k_q: qo[0] != 0, qo[b] < qo[b-1],
//   qo[b] > T_pad, qo[b] > out_cache_loc.numel(), or a request with more drafts than the compact
//   mask has columns (64 * words_per_row). Entries from k_q on repeat the last trusted one, so
//   rows from there on are padding (out 0, lse -inf) and every draft count fits the mask words.
// - kv_indptr is trusted up to its first bad entry k_kv: kv[0] outside [0, N], kv[b] < kv[b-1],
//   kv[b] > N (N = kv_indices.numel()).
// - Requests b >= min(k_q, k_kv) - 1 are void: no prefix keys, their n_b draft keys are slot -1
//   (invisible), mask words 0; so their rows get out 0, lse -inf. Every request keeps key count
//   >= draft count, and the total stays within verify_indices.
// - A slot outside [0, S) becomes -1; mask cells outside the mask read as "not visible".
// Values are clamped to [-1, INT32_MAX] before any comparison or arithmetic, so no predicate can
// overflow, and the first bad entry is the same as on the raw values (every bound is < 2^31).
//
// Two ways to a sanitized batch, chosen on the host from B (a template parameter, so that no
// pointer is ever shared memory in one launch and global memory in another):
// - staged (B <= kSharedBatch): every block loads the indptrs into shared memory, finds k_q and
//   k_kv with one block vote (and a second barrier only when an entry is bad), and its binary
//   searches run in shared memory;
// - unstaged (any B): a one-block pass (sanitize_indptrs_kernel) finds k_q, k_kv and the two key
//   counts the blocks need and records the indptr faults; the preparation's blocks then read those
//   four numbers and the indptrs themselves from global memory.
#pragma once
#include <climits>
#include <cstdint>
#include <tuple>

#include "index_view.cuh"
#include "status.cuh"
#if defined(__CUDACC__)
#include <c10/cuda/CUDAException.h>
#endif

namespace ddtree {

__device__ __forceinline__ int64_t clamp_value(int64_t v) { return v < -1 ? -1 : (v > kClampHigh ? kClampHigh : v); }

// What a preparation thread needs to know about the batch, from the raw indptrs.
struct BatchLimits {
  IndexView qo, kv, mask_indptr;
  bool has_mask_indptr;   // and the layout reads it (full, qlen)
  int batch;
  int64_t num_rows;       // T_pad
  int64_t num_draft_slots;  // out_cache_loc.numel()
  int64_t num_prefix;     // kv_indices.numel()
  int64_t draft_cap;      // 64 * words_per_row: columns of the compact mask
  int64_t max_draft_len;  // 0: not given
  int packed_width;       // bits per packed row, 0 for the byte layouts
};

// Largest batch whose indptrs (kSharedBatch + 1 entries each) are staged in shared memory.
constexpr int kSharedBatch = 1023;

// What the unstaged pass leaves for the preparation's blocks (int64 [4] on the device).
struct IndptrBounds {
  int64_t k_qo, k_kv, kv0, keys_at_void;
};

template <bool kStaged>
struct SanitizedBatch {
  const int32_t* s_qo;  // staged: the clamped indptrs in shared memory (unused otherwise)
  const int32_t* s_kv;
  IndexView qo, kv;
  int batch;
  int k_qo, k_kv;  // first bad entry of each indptr (batch + 1 if none)
  int first_void;  // requests b >= first_void are void (batch if none)
  int64_t kv0, keys_at_void;

  __device__ __forceinline__ int64_t raw_qo(int b) const {
    if constexpr (kStaged) return s_qo[b];
    else return clamp_value(qo[b]);
  }
  __device__ __forceinline__ int64_t raw_kv(int b) const {
    if constexpr (kStaged) return s_kv[b];
    else return clamp_value(kv[b]);
  }
  // Sanitized qo_indptr: monotone, within [0, min(T_pad, out_cache_loc.numel())], starts at 0.
  __device__ __forceinline__ int64_t qo_at(int b) const {
    if (b < k_qo) return raw_qo(b);
    return k_qo > 0 ? raw_qo(k_qo - 1) : 0;
  }
  __device__ __forceinline__ bool is_void(int b) const { return b >= first_void; }
  __device__ __forceinline__ int64_t num_draft(int b) const { return qo_at(b + 1) - qo_at(b); }
  __device__ __forceinline__ int64_t prefix_len(int b) const { return is_void(b) ? 0 : raw_kv(b + 1) - raw_kv(b); }
  // Sanitized verify_indptr[b]: the keys of requests before b (prefix + drafts, drafts only once void).
  __device__ __forceinline__ int64_t keys_before(int b) const {
    if (b <= first_void) return (b < k_kv ? raw_kv(b) - kv0 : 0) + qo_at(b);
    return keys_at_void + qo_at(b) - qo_at(first_void);
  }
  // The batch over a's indptrs whose first bad entries are k_qo and k_kv (staged: their clamped
  // copies s_qo, s_kv in shared memory), with first_void; kv0 and keys_at_void come from derive
  // or from the unstaged pass.
  __device__ __forceinline__ static SanitizedBatch over(const BatchLimits& a, const int32_t* s_qo, const int32_t* s_kv,
                                                         int k_qo, int k_kv) {
    SanitizedBatch s;
    s.s_qo = s_qo;
    s.s_kv = s_kv;
    s.qo = a.qo;
    s.kv = a.kv;
    s.batch = a.batch;
    s.k_qo = k_qo;
    s.k_kv = k_kv;
    const int trusted = k_qo < k_kv ? k_qo : k_kv;
    s.first_void = trusted > 0 ? trusted - 1 : 0;
    return s;
  }
  // kv0 and keys_at_void from the indptrs.
  __device__ __forceinline__ void derive() {
    kv0 = k_kv > 0 ? raw_kv(0) : 0;
    keys_at_void = 0;
    keys_at_void = keys_before(first_void);  // the first branch of keys_before
  }
};

template <class Batch>
struct KeysBefore {
  const Batch* s;
  __device__ __forceinline__ int64_t operator[](int64_t b) const { return s->keys_before(static_cast<int>(b)); }
};

// Entry b of the indptrs (clamped values, b - 1's too): whether it is the first bad entry of
// either, folded into the thread's running minimum; with `record`, its faults.
__device__ __forceinline__ void check_indptr_entry(const BatchLimits& a, StatusRecorder& status, bool record, int b,
                                                   int64_t q, int64_t q_prev, int64_t k, int64_t k_prev, int& first_q,
                                                   int& first_k) {
  const int64_t max_rows = a.num_rows < a.num_draft_slots ? a.num_rows : a.num_draft_slots;
  const int64_t drafts = q - q_prev;
  const bool q_bad = (b == 0 ? q != 0 : q < q_prev) || q > max_rows || (b > 0 && drafts > a.draft_cap);
  const bool k_bad = (b == 0 ? k < 0 : k < k_prev) || k > a.num_prefix;
  if (q_bad && b < first_q) first_q = b;
  if (k_bad && b < first_k) first_k = b;
  if (record) {  // qo and kv raw values are loaded again on a fault's path only (from L1: just read)
    if (b == 0 && q != 0) status.record(kQoStart, 0, a.qo[0]);
    if (b > 0 && q < q_prev) status.record(kQoOrder, b, a.qo[b]);
    if (b > 0 && k < k_prev) status.record(kKvOrder, b, a.kv[b]);
    if (q > a.num_rows) status.record(kQoRows, b, a.qo[b]);
    if (q > a.num_draft_slots) status.record(kQoSlots, b, a.qo[b]);
    if (k < 0 || k > a.num_prefix) status.record(kKvRange, b, a.kv[b]);
    if (b > 0 && a.packed_width > 0 && drafts > a.packed_width) status.record(kMaskWidth, b - 1, a.qo[b] - a.qo[b - 1]);
    if (b > 0 && ((a.max_draft_len > 0 && drafts > a.max_draft_len) || drafts > a.draft_cap))
      status.record(kDraftCount, b - 1, a.qo[b] - a.qo[b - 1]);
    // mask_indptr is read raw, by the recording block only: no other thread needs its order.
    if (b > 0 && a.has_mask_indptr && a.mask_indptr[b] < a.mask_indptr[b - 1])
      status.record(kMaskIndptrOrder, b, a.mask_indptr[b]);
  }
}

// The staged sanitizing (a.batch <= kSharedBatch). Every thread of the block calls this (it
// synchronises the block); `record` (one block) records the indptr faults, the faults that depend
// on slots and mask cells are recorded where they are read. One load round trip (entry b and b-1,
// the second mostly from L1), one block vote; a second barrier only where an entry is bad.
__device__ __forceinline__ SanitizedBatch<true> sanitize_staged(const BatchLimits& a, StatusRecorder& status, bool record) {
  __shared__ int32_t s_qo[kSharedBatch + 1], s_kv[kSharedBatch + 1];
  __shared__ int s_k_qo, s_k_kv;
  const int entries = a.batch + 1;
  if (threadIdx.x == 0) {
    s_k_qo = entries;
    s_k_kv = entries;
  }
  int first_q = entries, first_k = entries;
  for (int b = static_cast<int>(threadIdx.x); b < entries; b += blockDim.x) {
    const int64_t q = clamp_value(a.qo[b]), k = clamp_value(a.kv[b]);
    const int64_t q_prev = b == 0 ? 0 : clamp_value(a.qo[b - 1]);
    const int64_t k_prev = b == 0 ? 0 : clamp_value(a.kv[b - 1]);
    s_qo[b] = static_cast<int32_t>(q);
    s_kv[b] = static_cast<int32_t>(k);
    check_indptr_entry(a, status, record, b, q, q_prev, k, k_prev, first_q, first_k);
  }
  if (__syncthreads_or(first_q < entries || first_k < entries)) {  // block-uniform
    if (first_q < entries) atomicMin(&s_k_qo, first_q);
    if (first_k < entries) atomicMin(&s_k_kv, first_k);
    __syncthreads();
  }
  SanitizedBatch<true> s = SanitizedBatch<true>::over(a, s_qo, s_kv, s_k_qo, s_k_kv);
  s.derive();
  return s;
}

// The unstaged batch, from what sanitize_indptrs_kernel left (read by every thread: one load).
__device__ __forceinline__ SanitizedBatch<false> sanitized_from(const BatchLimits& a, const IndptrBounds* bounds) {
  const IndptrBounds d = *bounds;
  SanitizedBatch<false> s =
      SanitizedBatch<false>::over(a, nullptr, nullptr, static_cast<int>(d.k_qo), static_cast<int>(d.k_kv));
  s.kv0 = d.kv0;
  s.keys_at_void = d.keys_at_void;
  return s;
}

__device__ __forceinline__ int warp_min(int v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other < v ? other : v;
  }
  return v;
}

// The unstaged pass: one block of kThreads over the whole batch (any size). It records the
// indptr faults (the preparation's blocks then do not) and writes the IndptrBounds; with
// `qlen_start` (layout qlen without mask_indptr) also the start of every request's mask block,
// the exclusive sum of the sanitized n_b^2 (a block scan, tile by tile).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) sanitize_indptrs_kernel(BatchLimits a, StatusView view, IndptrBounds* out,
                                                                    int64_t* qlen_start) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ int s_first[2][kWarps];
  __shared__ int64_t s_warp_sum[kWarps];
  __shared__ int64_t s_carry;
  StatusRecorder status(view);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int entries = a.batch + 1;
  int first_q = entries, first_k = entries;
  // kRound entries per thread loaded before any is checked: one load round trip per round (the
  // checks' atomics would otherwise keep the compiler from hoisting the next entry's loads).
  constexpr int kRound = 4;
  for (int64_t base = threadIdx.x; base < entries; base += kRound * kThreads) {  // 64-bit: no overflow
    int64_t q[kRound], q_prev[kRound], k[kRound], k_prev[kRound];
#pragma unroll
    for (int j = 0; j < kRound; ++j) {
      const int64_t e = base + static_cast<int64_t>(j) * kThreads;
      const int b = static_cast<int>(e);
      const bool in = e < entries;
      q[j] = in ? clamp_value(a.qo[b]) : 0;
      k[j] = in ? clamp_value(a.kv[b]) : 0;
      q_prev[j] = in && b > 0 ? clamp_value(a.qo[b - 1]) : 0;
      k_prev[j] = in && b > 0 ? clamp_value(a.kv[b - 1]) : 0;
    }
#pragma unroll
    for (int j = 0; j < kRound; ++j) {
      const int64_t e = base + static_cast<int64_t>(j) * kThreads;
      if (e < entries) check_indptr_entry(a, status, true, static_cast<int>(e), q[j], q_prev[j], k[j], k_prev[j], first_q, first_k);
    }
  }
  first_q = warp_min(first_q);
  first_k = warp_min(first_k);
  if (lane == 0) {
    s_first[0][warp] = first_q;
    s_first[1][warp] = first_k;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {  // every thread: the block's minimum
    first_q = s_first[0][w] < first_q ? s_first[0][w] : first_q;
    first_k = s_first[1][w] < first_k ? s_first[1][w] : first_k;
  }
  SanitizedBatch<false> s = SanitizedBatch<false>::over(a, nullptr, nullptr, first_q, first_k);
  if (threadIdx.x == 0) {
    s.derive();
    *out = IndptrBounds{s.k_qo, s.k_kv, s.kv0, s.keys_at_void};
    s_carry = 0;
  }
  if (qlen_start == nullptr) return;  // uniform
  for (int64_t tile = 0; tile < a.batch; tile += kThreads) {
    const int64_t b = tile + threadIdx.x;
    int64_t size = 0;
    if (b < a.batch) {
      const int64_t n = s.num_draft(static_cast<int>(b));
      size = n * n;
    }
    int64_t inclusive = size;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int64_t v = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    if (lane == 31) s_warp_sum[warp] = inclusive;
    __syncthreads();  // also orders s_carry's last write before its read
    int64_t before = s_carry;
    for (int w = 0; w < warp; ++w) before += s_warp_sum[w];
    if (b < a.batch) qlen_start[b] = before + inclusive - size;
    __syncthreads();  // every thread has read s_carry and s_warp_sum
    if (threadIdx.x == kThreads - 1) s_carry = before + inclusive;
  }
}

constexpr int kSanitizeThreads = 1024;

#if defined(__CUDACC__)
// Host side of the unstaged pass: (bounds int64 [4], and with `qlen_starts` the qlen block starts
// int64 [B], else undefined), on the device of `qo_indptr`.
inline std::tuple<at::Tensor, at::Tensor> launch_sanitize_indptrs(const at::Tensor& qo_indptr, const BatchLimits& limits,
                                                                  const StatusView& status, bool qlen_starts,
                                                                  cudaStream_t stream) {
  const auto opts = qo_indptr.options().dtype(at::kLong);
  at::Tensor bounds = at::empty({4}, opts);
  at::Tensor starts = qlen_starts ? at::empty({limits.batch}, opts) : at::Tensor();
  static_assert(sizeof(IndptrBounds) == 4 * sizeof(int64_t), "IndptrBounds is int64 [4]");
  sanitize_indptrs_kernel<kSanitizeThreads><<<1, kSanitizeThreads, 0, stream>>>(
      limits, status, reinterpret_cast<IndptrBounds*>(bounds.data_ptr<int64_t>()),
      starts.defined() ? starts.data_ptr<int64_t>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {bounds, starts};
}
#endif

// Host side: the limits from tensors. `mask_indptr` only where the layout reads it.
inline BatchLimits make_batch_limits(const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                     const c10::optional<at::Tensor>& mask_indptr, int64_t num_rows,
                                     int64_t num_draft_slots, int64_t num_prefix, int64_t draft_cap,
                                     int64_t max_draft_len, int packed_width) {
  auto bound = [](int64_t v) { return v < 0 ? int64_t{0} : (v > kClampHigh ? kClampHigh : v); };
  return BatchLimits{view_of(qo_indptr),
                     view_of(kv_indptr),
                     mask_indptr.has_value() ? view_of(*mask_indptr) : view_of(qo_indptr),
                     mask_indptr.has_value(),
                     static_cast<int>(qo_indptr.numel() - 1),
                     bound(num_rows),
                     bound(num_draft_slots),
                     bound(num_prefix),
                     bound(draft_cap),
                     max_draft_len > 0 ? max_draft_len : 0,
                     packed_width};
}

}  // namespace ddtree
