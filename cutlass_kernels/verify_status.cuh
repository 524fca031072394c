// Bounds safety of the preparation launch: the status tensor's layout, the fault kinds, and the
// per-block view of a sanitized batch that every preparation thread reads instead of raw indptrs.
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
#pragma once
#include <cstdint>

#include "index_view.cuh"

namespace ddtree {

// Status: int32 [kStatusSize], owned by the caller, zeros before its first use.
//   [0] fault bits (1 << kind), 0 = the step was clean
//   [1] the lowest kind whose bit is set (-1 if none)     [2] its first position   [3] the value there
//   [4 + k] first position of kind k (-1 if none)
//   [kStatusAccum...] workspace of the launch, left zeroed by it (do not write). One launch at a
//   time per status tensor: the last block to finish publishes and clears the workspace.
constexpr int kStatusSize = 32;
constexpr int kStatusBits = 0, kStatusKind = 1, kStatusPosition = 2, kStatusValue = 3, kStatusPositions = 4;
constexpr int kStatusAccum = 16, kStatusAccumBits = 28, kStatusCounter = 31;

// Kinds in the order check_verify_inputs reports them; positions index the argument named.
enum Fault : int {
  kQoStart = 0,         // qo_indptr[0] != 0                       pos 0         value qo_indptr[0]
  kQoOrder = 1,         // qo_indptr[b] < qo_indptr[b-1]           pos b         value qo_indptr[b]
  kKvOrder = 2,         // kv_indptr[b] < kv_indptr[b-1]           pos b         value kv_indptr[b]
  kQoRows = 3,          // qo_indptr[b] > T_pad (rows of q)        pos b         value qo_indptr[b]
  kQoSlots = 4,         // qo_indptr[b] > out_cache_loc.numel()    pos b         value qo_indptr[b]
  kKvRange = 5,         // kv_indptr[b] outside [0, N]             pos b         value kv_indptr[b]
  kKvSlot = 6,          // kv_indices[i] outside [0, S)            pos i         value kv_indices[i]
  kDraftSlot = 7,       // out_cache_loc[i] outside [0, S)         pos i         value out_cache_loc[i]
  kMaskWidth = 8,       // packed: request b has more drafts than bits per row   pos b   value n_b
  kMaskIndptrOrder = 9, // mask_indptr[b] < mask_indptr[b-1]       pos b         value mask_indptr[b]
  kMaskRange = 10,      // request b reads mask cells outside tree_mask          pos b   value tree_mask.numel()
  kDraftCount = 11,     // request b has more drafts than max_draft_len          pos b   value n_b
  kNumFaults = 12,
};
static_assert(kStatusPositions + kNumFaults <= kStatusAccum && kStatusAccum + kNumFaults <= kStatusAccumBits, "status layout");

constexpr int64_t kClampHigh = 2147483647;  // values are clamped to [-1, kClampHigh]

__device__ __forceinline__ int64_t clamp_value(int64_t v) { return v < -1 ? -1 : (v > kClampHigh ? kClampHigh : v); }

// Faults are accumulated into the workspace: bits by OR, positions by max of (INT32_MAX - pos)
// (0 = none), so the earliest position wins whatever order the threads run in.
struct StatusView {
  int32_t* data;  // nullptr: the caller asked for no status
  __device__ __forceinline__ void record(int kind, int64_t pos) const {
    if (data == nullptr) return;
    const int32_t p = static_cast<int32_t>(pos < 0 ? 0 : (pos > kClampHigh - 1 ? kClampHigh - 1 : pos));
    atomicOr(data + kStatusAccumBits, 1 << kind);
    atomicMax(data + kStatusAccum + kind, static_cast<int32_t>(kClampHigh) - p);
    __threadfence();  // visible before this block's arrival at the counter (finish_status)
  }
};

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

// Indptrs of up to kSharedBatch + 1 entries are staged in shared memory (one load round trip,
// then the binary searches run there); longer ones are read (clamped) from global memory.
constexpr int kSharedBatch = 1023;

struct SanitizedBatch {
  const int32_t* s_qo;  // shared copies (clamped), or nullptr
  const int32_t* s_kv;
  IndexView qo, kv;
  int batch;
  int k_qo, k_kv;  // first bad entry of each indptr (batch + 1 if none)
  int first_void;  // requests b >= first_void are void (batch if none)
  int64_t kv0, keys_at_void;

  __device__ __forceinline__ int64_t raw_qo(int b) const { return s_qo ? s_qo[b] : clamp_value(qo[b]); }
  __device__ __forceinline__ int64_t raw_kv(int b) const { return s_kv ? s_kv[b] : clamp_value(kv[b]); }
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
};

struct KeysBefore {
  const SanitizedBatch* s;
  __device__ __forceinline__ int64_t operator[](int64_t b) const { return s->keys_before(static_cast<int>(b)); }
};

// Every thread of the block calls this (it synchronises the block). `record` (block 0 only)
// records the indptr faults; the faults that depend on slots and mask cells are recorded where
// they are read.
__device__ __forceinline__ SanitizedBatch sanitize_batch(const BatchLimits& a, const StatusView& status, bool record) {
  __shared__ int32_t s_qo[kSharedBatch + 1], s_kv[kSharedBatch + 1];
  __shared__ int s_k_qo, s_k_kv;
  const bool staged = a.batch <= kSharedBatch;
  const int entries = a.batch + 1;
  if (threadIdx.x == 0) {
    s_k_qo = entries;
    s_k_kv = entries;
  }
  for (int b = threadIdx.x; b < entries; b += blockDim.x) {
    if (staged) {
      s_qo[b] = static_cast<int32_t>(clamp_value(a.qo[b]));
      s_kv[b] = static_cast<int32_t>(clamp_value(a.kv[b]));
    }
    // Loaded in the same round trip as the staging (block 0 only): mask_indptr is read raw.
    if (record && b > 0 && a.has_mask_indptr && a.mask_indptr[b] < a.mask_indptr[b - 1]) status.record(kMaskIndptrOrder, b);
  }
  __syncthreads();
  const int64_t max_rows = a.num_rows < a.num_draft_slots ? a.num_rows : a.num_draft_slots;
  for (int b = threadIdx.x; b < entries; b += blockDim.x) {
    const int64_t q = staged ? s_qo[b] : clamp_value(a.qo[b]);
    const int64_t k = staged ? s_kv[b] : clamp_value(a.kv[b]);
    const int64_t q_prev = b == 0 ? 0 : (staged ? s_qo[b - 1] : clamp_value(a.qo[b - 1]));
    const int64_t k_prev = b == 0 ? 0 : (staged ? s_kv[b - 1] : clamp_value(a.kv[b - 1]));
    const int64_t drafts = q - q_prev;
    const bool q_bad = (b == 0 ? q != 0 : q < q_prev) || q > max_rows || (b > 0 && drafts > a.draft_cap);
    const bool k_bad = (b == 0 ? k < 0 : k < k_prev) || k > a.num_prefix;
    if (q_bad) atomicMin(&s_k_qo, b);
    if (k_bad) atomicMin(&s_k_kv, b);
    if (record) {
      if (b == 0 && q != 0) status.record(kQoStart, 0);
      if (b > 0 && q < q_prev) status.record(kQoOrder, b);
      if (b > 0 && k < k_prev) status.record(kKvOrder, b);
      if (q > a.num_rows) status.record(kQoRows, b);
      if (q > a.num_draft_slots) status.record(kQoSlots, b);
      if (k < 0 || k > a.num_prefix) status.record(kKvRange, b);
      if (b > 0 && a.packed_width > 0 && drafts > a.packed_width) status.record(kMaskWidth, b - 1);
      if (b > 0 && ((a.max_draft_len > 0 && drafts > a.max_draft_len) || drafts > a.draft_cap)) status.record(kDraftCount, b - 1);
    }
  }
  __syncthreads();
  SanitizedBatch s;
  s.s_qo = staged ? s_qo : nullptr;
  s.s_kv = staged ? s_kv : nullptr;
  s.qo = a.qo;
  s.kv = a.kv;
  s.batch = a.batch;
  s.k_qo = s_k_qo;
  s.k_kv = s_k_kv;
  const int trusted = s.k_qo < s.k_kv ? s.k_qo : s.k_kv;
  s.first_void = trusted > 0 ? trusted - 1 : 0;
  s.kv0 = s.k_kv > 0 ? s.raw_kv(0) : 0;
  s.keys_at_void = 0;
  s.keys_at_void = s.keys_before(s.first_void);  // the first branch of keys_before
  return s;
}

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

// The raw inputs whose value at the first position goes into status[kStatusValue].
struct StatusInputs {
  IndexView qo, kv, kv_indices, out_cache_loc, mask_indptr;
  bool has_mask_indptr;
  int64_t mask_numel;
};

__device__ __forceinline__ int32_t saturate_int32(int64_t v) {
  return static_cast<int32_t>(v < INT32_MIN ? INT32_MIN : (v > INT32_MAX ? INT32_MAX : v));
}

__device__ __forceinline__ int64_t fault_value(const StatusInputs& in, int kind, int64_t pos) {
  switch (kind) {
    case kQoStart: case kQoOrder: case kQoRows: case kQoSlots: return in.qo[pos];
    case kKvOrder: case kKvRange: return in.kv[pos];
    case kKvSlot: return in.kv_indices[pos];
    case kDraftSlot: return in.out_cache_loc[pos];
    case kMaskWidth: case kDraftCount: return in.qo[pos + 1] - in.qo[pos];
    case kMaskIndptrOrder: return in.mask_indptr[pos];
    default: return in.mask_numel;  // kMaskRange
  }
}

// Called by every thread of every block at the end of the launch: the last block to arrive
// publishes the status and zeroes the workspace, so the next launch (the next replay of a
// captured step) starts clean without a memset of its own.
__device__ __forceinline__ void finish_status(const StatusView& status, const StatusInputs& in) {
  if (status.data == nullptr) return;  // uniform over the grid
  __shared__ bool s_last;
  __shared__ int32_t s_pos[kNumFaults];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(status.data + kStatusCounter, 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!s_last) return;
  if (threadIdx.x < kNumFaults) {
    const int32_t encoded = atomicExch(status.data + kStatusAccum + threadIdx.x, 0);
    const int32_t pos = encoded == 0 ? -1 : static_cast<int32_t>(kClampHigh) - encoded;
    s_pos[threadIdx.x] = pos;
    status.data[kStatusPositions + threadIdx.x] = pos;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t bits = atomicExch(status.data + kStatusAccumBits, 0);
    const int kind = bits == 0 ? -1 : __ffs(bits) - 1;
    const int32_t pos = kind < 0 ? -1 : s_pos[kind];
    status.data[kStatusBits] = bits;
    status.data[kStatusKind] = kind;
    status.data[kStatusPosition] = pos;
    status.data[kStatusValue] = kind < 0 ? 0 : saturate_int32(fault_value(in, kind, pos));
    atomicExch(status.data + kStatusCounter, 0);
  }
}

}  // namespace ddtree
