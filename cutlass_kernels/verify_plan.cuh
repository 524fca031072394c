// The schedule plan of a verify batch: made once, by the preparation launch from the sanitized
// batch (verify_prep.cu), and read by the sm90 kernels (sm90/persistent_plan.cuh) and the
// persistent combine (ddtree_op/backends/sm90/persistent_combine.py), so that no CTA scans the
// batch. verify_plan.cu makes it alone, for a batch handed to the attention op directly. What the
// plan means is ddtree_op/backends/sm90/persistent_schedule.py; its CPU twin is
// ddtree_op/prep.py's verify_plan (both must agree bit for bit).
//
// Layout (int64; indices in contract.cuh): kPlanHeader entries, then kPlanFields arrays of
// plan_capacity(T_pad, H, B) entries, one per row block (a function of shapes only).
//   header         the choice (1: equal shares, 0: pieces), the row blocks and items (row
//                  block, unit) of all requests, CTAs with an equal share (min(CTAs, items)),
//                  and the heads, CTAs and splits the plan was made for (its readers check them)
//   row block r    its request, its block within the request, its units, its first item
//                  (past the last row block: request B, block 0, units 0, first item = items)
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "contract.cuh"

namespace ddtree {

// Each request's last row block may be short, so ceil(T * H / 64) + B row blocks at most.
__host__ __device__ __forceinline__ int64_t plan_capacity(int64_t tokens, int64_t heads, int64_t batch) {
  return (tokens * heads + kRowsPerBlock - 1) / kRowsPerBlock + batch;
}
__host__ __device__ __forceinline__ int64_t plan_numel(int64_t tokens, int64_t heads, int64_t batch) {
  return kPlanHeader + kPlanFields * plan_capacity(tokens, heads, batch);
}

struct PlanView {
  const int64_t* data;
  int64_t capacity;
  __device__ __forceinline__ int64_t header(int i) const { return data[i]; }
  __device__ __forceinline__ int64_t field(int f, int64_t row_block) const {
    return data[kPlanHeader + f * capacity + row_block];
  }
};

struct PlanArgs {
  int64_t* plan;      // nullptr: no plan
  int blocks;         // blocks that write it: one thread per row block entry, at least one (the header)
  int batch;
  int64_t capacity, heads;
  int ctas, splits;   // of the schedule the plan is made for
};

// Host side: the plan's arguments for blocks of `threads`, `plan` checked against the shapes
// (int64, plan_numel entries); no plan: no blocks.
inline PlanArgs make_verify_plan_args(const c10::optional<at::Tensor>& plan, const at::Device& device, int64_t num_rows,
                                      int64_t heads, int64_t batch, int64_t ctas, int64_t splits, int threads) {
  PlanArgs a{nullptr, 0, static_cast<int>(batch), plan_capacity(num_rows, heads, batch), heads, static_cast<int>(ctas),
             static_cast<int>(splits)};
  if (!plan.has_value()) return a;
  TORCH_CHECK(heads >= 1 && ctas >= 1 && splits >= 1, "ddtree_op: a plan needs heads, plan_ctas and plan_splits >= 1");
  TORCH_CHECK(plan->is_cuda() && plan->device() == device && plan->scalar_type() == at::kLong && plan->is_contiguous() &&
                  plan->numel() == plan_numel(num_rows, heads, batch),
              "ddtree_op: argument 'plan' must be a contiguous int64 tensor of ", plan_numel(num_rows, heads, batch),
              " entries on the device of the indptrs");
  a.plan = plan->data_ptr<int64_t>();
  a.blocks = static_cast<int>(a.capacity > 0 ? (a.capacity + threads - 1) / threads : 1);
  return a;
}

// Requests are scanned in chunks of kPlanChunk (kPlanChunk / kThreads consecutive ones a thread).
constexpr int kPlanChunk = 512;

template <int kThreads>
__device__ __forceinline__ void block_exclusive_sum2(int64_t& a, int64_t& b, int64_t& total_a, int64_t& total_b) {
  __shared__ int64_t s_a[kThreads / 32], s_b[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t ia = a, ib = b;
  for (int d = 1; d < 32; d *= 2) {
    const int64_t na = __shfl_up_sync(0xffffffffu, ia, d), nb = __shfl_up_sync(0xffffffffu, ib, d);
    if (lane >= d) ia += na, ib += nb;
  }
  if (lane == 31) s_a[warp] = ia, s_b[warp] = ib;
  __syncthreads();
  int64_t before_a = 0, before_b = 0;
  total_a = total_b = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before_a += s_a[w], before_b += s_b[w];
    total_a += s_a[w];
    total_b += s_b[w];
  }
  __syncthreads();  // s_a, s_b are read before the next call writes them
  a = before_a + ia - a;
  b = before_b + ib - b;
}

// Block `plan_block` of the plan's blocks writes entries [plan_block * kThreads, +kThreads), and
// block 0 the header. Every thread of the block calls it (it synchronises the block). Batch has
// num_draft(b) and keys_before(b) (the verify indptr); negative counts read as 0.
template <int kThreads, class Batch>
__device__ __forceinline__ void build_verify_plan(const PlanArgs& a, const Batch& batch, int plan_block) {
  static_assert(kPlanChunk % kThreads == 0, "a chunk is whole requests per thread");
  constexpr int kPerThread = kPlanChunk / kThreads;
  __shared__ int64_t s_block_end[kPlanChunk];   // inclusive: row blocks of requests up to this one
  __shared__ int64_t s_item_start[kPlanChunk];  // items of the requests before this one
  __shared__ unsigned long long s_longest;      // units of the longest request with row blocks
  if (threadIdx.x == 0) s_longest = 0;
  __syncthreads();
  const int64_t entry = int64_t(plan_block) * kThreads + threadIdx.x;
  const int64_t last_entry = int64_t(plan_block + 1) * kThreads - 1;
  auto work = [&](int b, int64_t& blocks, int64_t& units) {
    const int64_t drafts = batch.num_draft(b), keys = batch.keys_before(b + 1) - batch.keys_before(b);
    blocks = ((drafts > 0 ? drafts : 0) * a.heads + kRowsPerBlock - 1) / kRowsPerBlock;
    units = ((keys > 0 ? keys : 0) + kUnitKeys - 1) / kUnitKeys;
  };
  int64_t blocks_before = 0, items_before = 0;
  for (int c0 = 0; c0 < a.batch; c0 += kPlanChunk) {
    int64_t blocks[kPerThread], units[kPerThread];
    int64_t my_blocks = 0, my_items = 0, longest = 0;
    for (int i = 0; i < kPerThread; ++i) {
      const int b = c0 + threadIdx.x * kPerThread + i;
      blocks[i] = units[i] = 0;
      if (b < a.batch) work(b, blocks[i], units[i]);
      my_blocks += blocks[i];
      my_items += blocks[i] * units[i];
      if (blocks[i] > 0 && units[i] > longest) longest = units[i];
    }
    if (longest > 0) atomicMax(&s_longest, static_cast<unsigned long long>(longest));
    int64_t block_offset = my_blocks, item_offset = my_items, chunk_blocks, chunk_items;
    block_exclusive_sum2<kThreads>(block_offset, item_offset, chunk_blocks, chunk_items);
    block_offset += blocks_before;
    item_offset += items_before;
    for (int i = 0; i < kPerThread; ++i) {
      s_item_start[threadIdx.x * kPerThread + i] = item_offset;
      block_offset += blocks[i];
      item_offset += blocks[i] * units[i];
      s_block_end[threadIdx.x * kPerThread + i] = block_offset;
    }
    __syncthreads();
    if (entry < a.capacity && entry >= blocks_before && entry < blocks_before + chunk_blocks) {
      // The request of this row block: the first whose block end passes it.
      int lo = 0, hi = min(kPlanChunk, a.batch - c0) - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s_block_end[mid] > entry) hi = mid; else lo = mid + 1;
      }
      int64_t request_blocks, request_units;
      work(c0 + lo, request_blocks, request_units);
      const int64_t block = entry - (s_block_end[lo] - request_blocks);
      int64_t* const out = a.plan + kPlanHeader + entry;
      out[kPlanRequest * a.capacity] = c0 + lo;
      out[kPlanBlock * a.capacity] = block;
      out[kPlanUnits * a.capacity] = request_units;
      out[kPlanFirstItem * a.capacity] = s_item_start[lo] + block * request_units;
    }
    blocks_before += chunk_blocks;
    items_before += chunk_items;
    __syncthreads();  // the chunk's shared entries are read before the next chunk writes them
    // Every entry of this block is written: only block 0 (the header) needs the totals.
    if (plan_block != 0 && blocks_before > last_entry) break;
  }
  const int64_t row_blocks = blocks_before < a.capacity ? blocks_before : a.capacity;
  if (entry < a.capacity && entry >= row_blocks) {
    int64_t* const out = a.plan + kPlanHeader + entry;
    out[kPlanRequest * a.capacity] = a.batch;
    out[kPlanBlock * a.capacity] = 0;
    out[kPlanUnits * a.capacity] = 0;
    out[kPlanFirstItem * a.capacity] = items_before;
  }
  if (plan_block == 0 && threadIdx.x == 0) {
    // Equal shares where the longest piece times the waves of pieces exceeds a share by more than
    // a cut costs (unequal requests), or where pieces with splits would not fit 2 slots per CTA.
    const int64_t total = items_before, ctas = a.ctas, splits = a.splits;
    const int64_t used = total < ctas ? total : ctas;
    bool equal = false;
    if (total > 0) {
      const int64_t longest_piece = (static_cast<int64_t>(s_longest) + splits - 1) / splits;
      const int64_t share = (total + used - 1) / used;
      const int64_t waves = (row_blocks * splits + ctas - 1) / ctas;
      const bool pieces_fit = splits == 1 || row_blocks * splits <= 2 * ctas;
      equal = !pieces_fit || share + kCutCostUnits < waves * longest_piece;
    }
    int64_t* const h = a.plan;
    h[kPlanEqualShares] = equal ? 1 : 0;
    h[kPlanRowBlocks] = row_blocks;
    h[kPlanItems] = total;
    h[kPlanUsed] = used;
    h[kPlanHeads] = a.heads;
    h[kPlanCtas] = ctas;
    h[kPlanSplits] = splits;
    h[kPlanHeader - 1] = 0;
  }
}

}  // namespace ddtree
