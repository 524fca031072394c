// The verify step's status tensor (ddtree_op/status.py is its Python side): the layout, the fault
// kinds, how a thread records a fault, and the two ways the status is published.
//
// Int32 [kStatusSize], owned by the caller, zeros before its first use.
//   [0] fault bits (1 << kind), 0 = the step was clean
//   [1] the lowest kind whose bit is set (-1 if none)     [2] its first position   [3] the value there
//   [4 + k] first position of kind k (-1 if none)
//   [kStatusWorkspace...] workspace, zeros between steps (do not write): from its first 8-byte
//   aligned word, one 64-bit key per kind, then one 64-bit ticket.
// A key is ~(position << 32 | uint32(value)), accumulated by atomicMax: 0 means none, and the
// earliest position wins whatever order the threads run in, its raw value (saturated to int32)
// with it. The fault's value is known where it is recorded, so whoever publishes needs no input.
//
// Publishing: status[0:16) from the keys, which are cleared for the next step (the next replay of
// a captured step starts clean without a memset of its own).
// - The verify step (mla_tree_verify, the paged entry point): the attention launch that follows
//   the preparation on the same stream publishes (publish_status, one thread of its first CTA).
//   Every preparation block has finished when it starts, so the preparation takes no ticket and a
//   clean step costs it nothing.
// - The preparation op alone: its last block publishes (finish_status), found by the ticket: the
//   blocks that have finished (high 32 bits) and the fault bits (low 32).
// One step at a time per status tensor.
#pragma once
#include <climits>
#include <cstdint>

namespace ddtree {

constexpr int kStatusSize = 48;
constexpr int kStatusBits = 0, kStatusKind = 1, kStatusPosition = 2, kStatusValue = 3, kStatusPositions = 4;
constexpr int kStatusWorkspace = 16;

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
// The keys and the ticket from word kStatusWorkspace, or the next one where that is not 8-byte aligned.
static_assert(kStatusPositions + kNumFaults <= kStatusWorkspace &&
                  kStatusWorkspace + 1 + 2 * (kNumFaults + 1) <= kStatusSize,
              "status layout");

constexpr int64_t kClampHigh = 2147483647;  // index values are clamped to [-1, kClampHigh]
constexpr unsigned long long kTicketArrival = 1ull << 32;

__host__ __device__ __forceinline__ int32_t saturate_int32(int64_t v) {
  return static_cast<int32_t>(v < INT32_MIN ? INT32_MIN : (v > INT32_MAX ? INT32_MAX : v));
}

struct StatusView {
  int32_t* data;               // nullptr: the caller asked for no status
  unsigned long long* keys;    // [kNumFaults] inside data's workspace, then the ticket
  unsigned long long* ticket;  // nullptr: the attention launch that follows publishes
};

// Host side: the view of a status tensor's data (nullptr for none); `last_block_publishes` takes
// the ticket (the preparation op alone).
inline StatusView make_status_view(int32_t* data, bool last_block_publishes) {
  if (data == nullptr) return {nullptr, nullptr, nullptr};
  int32_t* word = data + kStatusWorkspace;
  if (reinterpret_cast<uintptr_t>(word) % 8 != 0) ++word;
  auto* keys = reinterpret_cast<unsigned long long*>(word);
  return {data, keys, last_block_publishes ? keys + kNumFaults : nullptr};
}

// One thread's side of the status: a fault's key by atomicMax, and with a ticket its bit by OR
// into it. `recorded` tells finish_status that this block must fence before it arrives; a clean
// block never does.
struct StatusRecorder {
  StatusView view;
  bool recorded;
  __device__ __forceinline__ explicit StatusRecorder(const StatusView& v) : view(v), recorded(false) {}
  // `value`: the raw value at `pos` of the argument the kind names (the caller loads it only here,
  // on the fault's path).
  __device__ __forceinline__ void record(int kind, int64_t pos, int64_t value) {
    if (view.keys == nullptr) return;
    const uint32_t p = static_cast<uint32_t>(pos < 0 ? 0 : (pos > kClampHigh - 1 ? kClampHigh - 1 : pos));
    const unsigned long long key = static_cast<unsigned long long>(p) << 32 | static_cast<uint32_t>(saturate_int32(value));
    atomicMax(view.keys + kind, ~key);
    if (view.ticket != nullptr) atomicOr(view.ticket, 1ull << kind);
    recorded = true;
  }
};

// A key's position and value (the key is not 0).
__device__ __forceinline__ int32_t key_position(unsigned long long key) { return static_cast<int32_t>(~static_cast<uint32_t>(key >> 32)); }
__device__ __forceinline__ int32_t key_value(unsigned long long key) { return static_cast<int32_t>(~static_cast<uint32_t>(key)); }

__device__ __forceinline__ void write_status_head(int32_t* data, uint32_t bits, int kind, int32_t pos, int32_t value) {
  data[kStatusBits] = static_cast<int32_t>(bits);
  data[kStatusKind] = kind;
  data[kStatusPosition] = pos;
  data[kStatusValue] = value;
}

// One thread publishes what the keys hold and clears them and the ticket: the attention launch
// after a preparation that took no ticket (every thread of that preparation has finished).
// One load round trip; a clean step writes the same words as a faulty one.
__device__ __forceinline__ void publish_status(const StatusView& view) {
  unsigned long long key[kNumFaults];
#pragma unroll
  for (int k = 0; k < kNumFaults; ++k) key[k] = view.keys[k];
  uint32_t bits = 0;
  int kind = -1;
  int32_t pos = -1, value = 0;
#pragma unroll
  for (int k = 0; k < kNumFaults; ++k) {
    const bool present = key[k] != 0;
    view.data[kStatusPositions + k] = present ? key_position(key[k]) : -1;
    if (present && kind < 0) {
      kind = k;
      pos = key_position(key[k]);
      value = key_value(key[k]);
    }
    bits |= static_cast<uint32_t>(present) << k;
  }
  write_status_head(view.data, bits, kind, pos, value);
#pragma unroll
  for (int k = 0; k <= kNumFaults; ++k) view.keys[k] = 0;  // the keys and the ticket
}

// The preparation op alone: called by every thread of every block at the end of its launch. Each
// block arrives with one atomic on the ticket (a block that recorded a fault fences first, so
// that its keys are visible to whoever sees its arrival); the last block to arrive publishes and
// clears the keys and the ticket. Clean step: one barrier vote, one atomic per block, 16 stores
// in the last. Without a ticket (the attention launch publishes) it does nothing.
__device__ __forceinline__ void finish_status(const StatusRecorder& status) {
  const StatusView& view = status.view;
  if (view.ticket == nullptr) return;  // uniform over the grid
  __shared__ unsigned long long s_ticket;
  __shared__ unsigned long long s_key[kNumFaults];
  const bool faulted = __syncthreads_or(status.recorded);
  if (threadIdx.x == 0) {
    if (faulted) __threadfence();
    s_ticket = atomicAdd(view.ticket, kTicketArrival);
  }
  __syncthreads();
  const unsigned long long ticket = s_ticket;
  if ((ticket >> 32) != gridDim.x - 1) return;
  const uint32_t bits = static_cast<uint32_t>(ticket);
  if (bits == 0) {
    if (threadIdx.x < kStatusWorkspace) view.data[threadIdx.x] = threadIdx.x == kStatusBits || threadIdx.x == kStatusValue ? 0 : -1;
    if (threadIdx.x == 0) *view.ticket = 0;
    return;
  }
  __threadfence();  // the keys of the blocks that arrived before
  if (threadIdx.x < kNumFaults) {
    const unsigned long long key = bits >> threadIdx.x & 1 ? atomicExch(view.keys + threadIdx.x, 0ull) : 0ull;
    s_key[threadIdx.x] = key;
    view.data[kStatusPositions + threadIdx.x] = key != 0 ? key_position(key) : -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int kind = __ffs(static_cast<int>(bits)) - 1;
    write_status_head(view.data, bits, kind, key_position(s_key[kind]), key_value(s_key[kind]));
    *view.ticket = 0;
  }
}

}  // namespace ddtree
