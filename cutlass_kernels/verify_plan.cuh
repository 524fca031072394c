// The schedule plan of a verify batch: made once, by the preparation launch from the sanitized
// batch (verify_prep.cu), and read by the sm90 kernels (sm90/tile_scheduler.cuh) and their
// combines (ddtree_op/backends/sm90/), so that no CTA scans the batch. verify_plan.cu makes it
// alone, for a batch handed to the attention op directly. What the plan means is
// ddtree_op/backends/sm90/persistent_schedule.py (the persistent kernel) and schedule.py (the
// split kernel's pieces); its CPU twin is ddtree_op/prep.py's verify_plan (bit for bit).
//
// Layout (int64; indices in contract.cuh): kPlanHeader entries, kPlanFields arrays of
// plan_capacity(T_pad, H, B) entries, one per row block, then kPieceFields arrays of
// piece_capacity entries, one per piece, then one more entry per row block (all functions of
// shapes only).
//   header         the choice (1: equal shares, 0: pieces), the row blocks and items (row
//                  block, unit) of all requests, CTAs with an equal share (min(CTAs, items)),
//                  the heads, CTAs and splits the plan was made for (its readers check them),
//                  and the split kernel's pieces
//   row block r    its request, its block within the request, its units, its first item (past
//                  the last row block: request B, block 0, units 0, first item = items)
//   piece p        its row (request << 32 | block), its units (begin << 32 | end), its partial
//                  slot (pieces of its row block << 32 | its index k among them: it writes
//                  partial rows [k, row]; with splits > 1) or -1 (out/lse directly; past the last
//                  piece: request B, block 0, units 0, slot -1)
//   row block r    (the last array) the partials of it that the running persistent kernel
//                  has written: 0 between launches (sm90/merge.cuh), the one entry a kernel writes
// The split kernel's pieces: each row block's units cut into max(1, ceil(units / c)) nearly
// equal pieces, c the fewest units for which all of them fit a budget (the shapes' row blocks
// times the splits, what a batch of equal requests gets; at most one wave of CTAs; or the row
// blocks where they are more) and no row block has more than kPieceSlotsPerSplit * splits. So the
// CTAs of a long request take its keys in more pieces instead of longer ones. One piece per row
// block with one split. In a batch of at most kLongestFirstMaxBatch requests the pieces go
// longest first: requests by their longest piece, descending (ties in request order), each
// request's row blocks in order and a row block's pieces together; the hardware dispatches CTAs
// in order, so the long pieces start in the first wave and the short ones fill in behind them.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "contract.cuh"
#include "plan_clocks.cuh"

namespace ddtree {

// Each request's last row block may be short, so ceil(T * H / 64) + B row blocks at most.
__host__ __device__ __forceinline__ int64_t plan_capacity(int64_t tokens, int64_t heads, int64_t batch) {
  return (tokens * heads + kRowsPerBlock - 1) / kRowsPerBlock + batch;
}
// Pieces a plan of `capacity` row blocks has room for: one per row block and kMaxPieceBudget more.
__host__ __device__ __forceinline__ int64_t piece_capacity(int64_t capacity) { return capacity + kMaxPieceBudget; }
__host__ __device__ __forceinline__ int64_t piece_capacity(int64_t tokens, int64_t heads, int64_t batch) {
  return piece_capacity(plan_capacity(tokens, heads, batch));
}
__host__ __device__ __forceinline__ int64_t plan_partials_written_offset(int64_t capacity) {
  return kPlanHeader + kPlanFields * capacity + kPieceFields * piece_capacity(capacity);
}
__host__ __device__ __forceinline__ int64_t plan_numel(int64_t tokens, int64_t heads, int64_t batch) {
  return plan_partials_written_offset(plan_capacity(tokens, heads, batch)) + plan_capacity(tokens, heads, batch);
}
// CTAs of the split kernel (contract.py's split_grid): room for every piece and one more CTA.
__host__ __device__ __forceinline__ int64_t split_grid(int64_t tokens, int64_t heads, int64_t batch, int64_t splits) {
  const int64_t nominal = (tokens * heads + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t budget = nominal * splits < kMaxPieceBudget ? nominal * splits : kMaxPieceBudget;
  const int64_t capacity = plan_capacity(tokens, heads, batch);
  return capacity > budget + 1 ? capacity : budget + 1;
}

struct PlanView {
  const int64_t* data;
  int64_t capacity;
  __device__ __forceinline__ int64_t header(int i) const { return data[i]; }
  __device__ __forceinline__ int64_t field(int f, int64_t row_block) const {
    return data[kPlanHeader + f * capacity + row_block];
  }
  __device__ __forceinline__ int64_t piece(int f, int64_t p) const {
    return data[kPlanHeader + kPlanFields * capacity + f * piece_capacity(capacity) + p];
  }
  // The one array a kernel writes (sm90/merge.cuh): row block r's count, back at 0 when the kernel ends.
  __device__ __forceinline__ unsigned long long* partials_written(int64_t row_block) const {
    return reinterpret_cast<unsigned long long*>(const_cast<int64_t*>(data) + plan_partials_written_offset(capacity) + row_block);
  }
};

struct PlanArgs {
  int64_t* plan;      // nullptr: no plan
  int blocks;         // blocks that write it: one thread per piece entry (more than row blocks), at least one
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
  a.blocks = static_cast<int>((piece_capacity(a.capacity) + threads - 1) / threads);
  return a;
}

// Requests are scanned in chunks of kPlanChunk (kPlanChunk / kThreads consecutive ones a thread).
constexpr int kPlanChunk = 256;

// Exclusive prefix sums over the block of kN values a thread, continuing `running` (shared: the
// totals of earlier calls, which this call adds its own to).
template <int kThreads, int kN>
__device__ __forceinline__ void block_exclusive_sums(int64_t (&v)[kN], int64_t (&running)[kN]) {
  __shared__ int64_t s_warp[kN][kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < kN; ++i) {
    int64_t inclusive = v[i];
    for (int d = 1; d < 32; d *= 2) {
      const int64_t n = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += n;
    }
    if (lane == 31) s_warp[i][warp] = inclusive;
    v[i] = inclusive - v[i];
  }
  __syncthreads();
  for (int i = 0; i < kN; ++i) {
    int64_t before = running[i];
    for (int w = 0; w < warp; ++w) before += s_warp[i][w];
    v[i] += before;
  }
  __syncthreads();  // every thread has read running and s_warp
  if (threadIdx.x < kN) {
    int64_t total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += s_warp[threadIdx.x][w];
    running[threadIdx.x] += total;
  }
  __syncthreads();  // running is updated before it is read, and s_warp before the next call writes it
}

// Reductions over the block of kN values a thread, in one pass: value i is summed, or its
// maximum taken where bit i of kMaxMask is set.
template <int kThreads, int kN, unsigned kMaxMask = 0>
__device__ __forceinline__ void block_reduce(int64_t (&v)[kN]) {
  __shared__ int64_t s_warp[kN][kThreads / 32];
  auto combine = [](int i, int64_t x, int64_t y) { return (kMaxMask >> i & 1u) ? (x > y ? x : y) : x + y; };
  for (int d = 16; d > 0; d /= 2) {
    for (int i = 0; i < kN; ++i) v[i] = combine(i, v[i], __shfl_xor_sync(0xffffffffu, v[i], d));
  }
  if (threadIdx.x % 32 == 0) {
    for (int i = 0; i < kN; ++i) s_warp[i][threadIdx.x / 32] = v[i];
  }
  __syncthreads();
  for (int i = 0; i < kN; ++i) {
    v[i] = s_warp[i][0];
    for (int w = 1; w < kThreads / 32; ++w) v[i] = combine(i, v[i], s_warp[i][w]);
  }
  __syncthreads();  // s_warp is read before the next call writes it
}

// Row blocks and units (pairs of key tiles) of request b; negative counts read as 0.
template <class Batch>
__device__ __forceinline__ void request_work(const PlanArgs& a, const Batch& batch, int b, int64_t& blocks, int64_t& units) {
  const int64_t drafts = batch.num_draft(b), keys = batch.keys_before(b + 1) - batch.keys_before(b);
  blocks = ((drafts > 0 ? drafts : 0) * a.heads + kRowsPerBlock - 1) / kRowsPerBlock;
  units = ((keys > 0 ? keys : 0) + kUnitKeys - 1) / kUnitKeys;
}

// Pieces of a row block of `units` cut into pieces of at most `piece_units` (32-bit: units come
// from int32 indptrs, so they are below 2^25; 64-bit divisions spill in the preparation kernel).
__host__ __device__ __forceinline__ int pieces_of(int64_t units, int piece_units) {
  const int u = static_cast<int>(units);
  return u > piece_units ? (u - 1) / piece_units + 1 : 1;
}
constexpr int kUncut = 0x7fffffff;  // piece units that cut nothing
// Units [begin, end) of piece k of n of a row block: the first units % n pieces one unit longer.
__host__ __device__ __forceinline__ int64_t piece_unit_range(int64_t units, int k, int n) {
  const int u = static_cast<int>(units), q = u / n, r = u % n;
  const int begin = k * q + (k < r ? k : r);
  return int64_t(begin) << 32 | (begin + q + (k < r ? 1 : 0));
}

// a / b for a >= 0, b > 0, in 32 bits where both fit: a 64-bit division is a long routine, and the
// plan's few are on its one thread's critical path.
__device__ __forceinline__ int64_t plan_div(int64_t a, int64_t b) {
  if (((a | b) >> 32) == 0) return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  return a / b;
}

// What the plan's choices need of the whole batch, reduced over the block (every thread gets it).
struct BatchTotals {
  int64_t work;     // items (row block, unit) of all requests
  int64_t rows;     // row blocks of all requests
  int64_t longest;  // units of the longest request with row blocks
  int64_t lanes;    // row blocks of every request where they all have the same, else -1
  int64_t units;    // units of every request where they all have the same, else -1
};
template <int kThreads, class Batch>
__device__ __forceinline__ BatchTotals batch_totals(const PlanArgs& a, const Batch& batch) {
  int64_t first_blocks = 0, first_units = 0;
  if (a.batch > 0) request_work(a, batch, 0, first_blocks, first_units);
  // work, rows, longest, whether a request's row blocks differ from the first's, whether its units do
  int64_t v[5] = {0, 0, 0, 0, 0};
  for (int b = threadIdx.x; b < a.batch; b += kThreads) {
    int64_t blocks, units;
    request_work(a, batch, b, blocks, units);
    v[0] += blocks * units;
    v[1] += blocks;
    if (blocks > 0 && units > v[2]) v[2] = units;
    if (blocks != first_blocks) v[3] = 1;
    if (units != first_units) v[4] = 1;
  }
  block_reduce<kThreads, 5, 0b11100>(v);
  return {v[0], v[1], v[2], v[3] == 0 ? first_blocks : -1, v[4] == 0 ? first_units : -1};
}

// The persistent kernel's choice (persistent_schedule.py): equal shares where the longest piece
// times the waves of pieces exceeds a share by more than a cut costs (unequal requests), or where
// pieces with splits would not fit 2 slots per CTA; lane by lane (lanes > 0) where every request
// has the same row blocks R, the batch is one scan chunk and R P of the CTAs (P = min(G / R, U))
// are at least kLaneSharesMinUse eighths of them. `used`: the CTAs with an equal share.
struct PlanChoice {
  bool equal;
  int lanes;
  int64_t used;
};
__device__ __forceinline__ PlanChoice plan_choice(const PlanArgs& a, const BatchTotals& t) {
  const int64_t total = t.work, ctas = a.ctas, splits = a.splits;
  const int64_t row_blocks = t.rows < a.capacity ? t.rows : a.capacity;
  PlanChoice c{false, 0, total < ctas ? total : ctas};
  if (total <= 0) return c;
  const int64_t longest_piece = plan_div(t.longest + splits - 1, splits);
  const int64_t share = plan_div(total + c.used - 1, c.used);
  const int64_t waves = plan_div(row_blocks * splits + ctas - 1, ctas);
  const bool pieces_fit = splits == 1 || row_blocks * splits <= 2 * ctas;
  c.equal = !pieces_fit || share + kCutCostUnits < waves * longest_piece;
  const int64_t lanes = t.lanes;
  if (!c.equal || a.batch > kLaneSharesMaxBatch || lanes < 1 || t.rows > a.capacity) return c;
  const int64_t per_lane = plan_div(total, lanes), lane_ctas = plan_div(ctas, lanes);
  const int64_t parts = lane_ctas < per_lane ? lane_ctas : per_lane;
  if (parts < 1 || 8 * lanes * parts < int64_t(kLaneSharesMinUse) * ctas) return c;
  c.lanes = static_cast<int>(lanes);
  c.used = lanes * parts;
  return c;
}

// The split kernel's piece length c (the header comment), from the batch's totals.
template <int kThreads, class Batch>
__device__ __forceinline__ int split_piece_units(const PlanArgs& a, const Batch& batch, const BatchTotals& t) {
  if (a.splits <= 1) return kUncut;
  const int64_t work = t.work, rows = t.rows, longest = t.longest;
  const int64_t nominal = a.capacity - a.batch, wave = a.ctas < kMaxPieceBudget ? a.ctas : kMaxPieceBudget;
  int64_t budget = nominal * a.splits < wave ? nominal * a.splits : wave;
  if (rows > budget) budget = rows;
  auto fits = [&](int c) {
    int64_t pieces = 0;
    for (int b = threadIdx.x; b < a.batch; b += kThreads) {
      int64_t blocks, units;
      request_work(a, batch, b, blocks, units);
      pieces += blocks * pieces_of(units, c);
    }
    int64_t total[1] = {pieces};
    block_reduce<kThreads, 1>(total);
    return total[0] <= budget;
  };
  // The least c in [lo, hi] that fits (hi, the longest row block, fits: one piece each). The
  // lower bound is the answer for equal requests, so it is tried first.
  int lo = static_cast<int>(budget > 0 ? plan_div(work + budget - 1, budget) : 1), hi = static_cast<int>(longest);
  // At most kPieceSlotsPerSplit * splits pieces a row block: its partial slots.
  const int64_t slots = int64_t(kPieceSlotsPerSplit) * a.splits;
  const int64_t slot_bound = plan_div(longest + slots - 1, slots);
  if (slot_bound > lo) lo = static_cast<int>(slot_bound);
  if (lo < 1) lo = 1;
  if (hi < lo) hi = lo;
  if (t.lanes > 0 && t.units >= 0) {
    // Equal requests (R row blocks of U units each): c fits where rows * ceil(U / c) <= budget,
    // so the least c that does is ceil(U / floor(budget / rows)), without a search.
    const int64_t per_row = plan_div(budget, rows);  // >= 1: budget >= rows
    const int least = static_cast<int>(plan_div(t.units + per_row - 1, per_row));
    return least > lo ? least : lo;
  }
  if (fits(lo)) return lo;
  ++lo;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid; else lo = mid + 1;
  }
  return hi;
}

// Block `plan_block` of the plan's blocks writes entries [plan_block * kThreads, +kThreads) of
// the row block and piece arrays, and block 0 the header. Every thread of the block calls it (it
// synchronises the block). Batch has num_draft(b) and keys_before(b) (the verify indptr). `clock`
// times its phases in a debug build (plan_clocks.cuh).
template <int kThreads, class Batch>
__device__ __forceinline__ void build_verify_plan(const PlanArgs& a, const Batch& batch, int plan_block,
                                                  const PlanClock& clock) {
  static_assert(kPlanChunk % kThreads == 0, "a chunk is whole requests per thread");
  static_assert(kLaneSharesMaxBatch <= kPlanChunk, "lane by lane, the row block entries need the batch in one chunk");
  static_assert(kLongestFirstMaxBatch <= kPlanChunk, "longest first, the pieces' order needs the batch in one chunk");
  static_assert(kLongestFirstMaxBatch <= kThreads, "longest first, every request has a thread to rank it");
  constexpr int kPerThread = kPlanChunk / kThreads;
  __shared__ int64_t s_block_end[kPlanChunk];   // inclusive: row blocks of requests up to this one
  __shared__ int64_t s_item_start[kPlanChunk];  // items of the requests before this one
  __shared__ int64_t s_piece_end[kPlanChunk];   // inclusive: pieces of requests up to this one
  __shared__ int s_pieces[kPlanChunk];          // pieces of each row block of this request
  __shared__ int s_longest[kPlanChunk];         // units of this request's longest piece (0: no row blocks)
  __shared__ uint32_t s_request_pieces[kPlanChunk];  // pieces of this request (below 2^32, as in the sums below)
  __shared__ int s_order[kPlanChunk];           // longest first: the request (in the chunk) at each rank
  __shared__ int64_t s_ranked_piece_end[kPlanChunk];  // longest first: inclusive, pieces of ranks up to this one
  const BatchTotals totals = batch_totals<kThreads>(a, batch);
  clock.mark(kPlanTotals);
  const PlanChoice choice = plan_choice(a, totals);
  clock.mark(kPlanChoice);
  if (plan_block == 0 && threadIdx.x == 0) {  // the choice's header entries now, so that it is not held across the scan
    a.plan[kPlanEqualShares] = choice.equal ? 1 : 0;
    a.plan[kPlanUsed] = choice.used;
  }
  const int lanes = choice.lanes;
  const bool longest_first = a.batch <= kLongestFirstMaxBatch;  // one chunk
  const int piece_units = split_piece_units<kThreads>(a, batch, totals);
  clock.mark(kPlanPieceSearch);
  const int64_t entry = int64_t(plan_block) * kThreads + threadIdx.x;
  // Recomputed where they are used: held across the scan, they spill in the staged preparation.
  auto row_fields = [&] { return a.plan + kPlanHeader; };
  auto piece_fields = [&] { return a.plan + kPlanHeader + kPlanFields * a.capacity; };
  auto partials_written_fields = [&] { return piece_fields() + kPieceFields * piece_capacity(a.capacity); };
  // Prefix sums of (row blocks << 32 | pieces), which both stay below 2^32, and of items (lane by
  // lane: of one lane's units, so that a row block's first item needs no division).
  enum { kBlocksPieces, kItems };
  __shared__ int64_t s_before[2];  // of the chunks scanned
  if (threadIdx.x < 2) s_before[threadIdx.x] = 0;
  __syncthreads();
  for (int c0 = 0; c0 < a.batch; c0 += kPlanChunk) {
    int64_t blocks[kPerThread], units[kPerThread];
    int64_t mine[2] = {0, 0};
    for (int i = 0; i < kPerThread; ++i) {
      const int b = c0 + threadIdx.x * kPerThread + i;
      blocks[i] = units[i] = 0;
      if (b < a.batch) request_work(a, batch, b, blocks[i], units[i]);
      const int pieces = pieces_of(units[i], piece_units);
      s_pieces[threadIdx.x * kPerThread + i] = pieces;
      // 32-bit, as in pieces_of (units of 0 have one piece: a key of 0)
      s_longest[threadIdx.x * kPerThread + i] = blocks[i] > 0 ? (static_cast<int>(units[i]) - 1) / pieces + 1 : 0;
      s_request_pieces[threadIdx.x * kPerThread + i] = static_cast<uint32_t>(blocks[i] * pieces);
      mine[kBlocksPieces] += blocks[i] << 32 | blocks[i] * pieces;
      mine[kItems] += lanes > 0 ? units[i] : blocks[i] * units[i];  // lane by lane: the units of one lane
    }
    const int64_t blocks_before = s_before[kBlocksPieces] >> 32, pieces_before = s_before[kBlocksPieces] & 0xffffffff;
    block_exclusive_sums<kThreads, 2>(mine, s_before);
    for (int i = 0; i < kPerThread; ++i) {
      s_item_start[threadIdx.x * kPerThread + i] = mine[kItems];
      mine[kBlocksPieces] += blocks[i] << 32 | blocks[i] * s_pieces[threadIdx.x * kPerThread + i];
      mine[kItems] += lanes > 0 ? units[i] : blocks[i] * units[i];
      s_block_end[threadIdx.x * kPerThread + i] = mine[kBlocksPieces] >> 32;
      s_piece_end[threadIdx.x * kPerThread + i] = mine[kBlocksPieces] & 0xffffffff;
    }
    __syncthreads();
    if (longest_first) {
      // Each request's rank and where its pieces end in rank order. A group of threads ranks one
      // request (B <= kThreads): each compares a strided share of the batch, shuffles add the
      // shares, so the loop is B / group long, not B.
      const int per_request = kThreads / a.batch;
      const int group = min(32, 1 << (31 - __clz(per_request)));  // a power of two: the shuffles stay inside it
      const int me = threadIdx.x / group, share = threadIdx.x % group;
      const int key = me < a.batch ? s_longest[me] : 0;
      int rank = 0;
      uint32_t before = 0;
      if (me < a.batch) {
#pragma unroll 4
        for (int j = share; j < a.batch; j += group) {
          const int other = s_longest[j];
          if (other > key || (other == key && j < me)) {
            ++rank;
            before += s_request_pieces[j];
          }
        }
      }
      for (int d = group / 2; d > 0; d /= 2) {
        rank += __shfl_xor_sync(0xffffffffu, rank, d);
        before += __shfl_xor_sync(0xffffffffu, before, d);
      }
      if (me < a.batch && share == 0) {
        s_order[rank] = me;
        s_ranked_piece_end[rank] = before + s_request_pieces[me];
      }
      __syncthreads();
    }
    // The request of entry: the first of the chunk whose end (row blocks or pieces) passes it.
    auto request_of = [&](const int64_t* ends) {
      int lo = 0, hi = min(kPlanChunk, a.batch - c0) - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (ends[mid] > entry) hi = mid; else lo = mid + 1;
      }
      return lo;
    };
    if (entry < a.capacity && entry >= blocks_before && entry < (s_before[kBlocksPieces] >> 32)) {  // row block entry
      // Lane by lane (one chunk, every request `lanes` row blocks): entry e is block e / B of
      // request e % B, after the lanes before it (U units each) and the requests before it.
      const int lo = lanes > 0 ? static_cast<int>(uint32_t(entry) % uint32_t(a.batch)) : request_of(s_block_end);
      int64_t request_blocks, request_units;
      request_work(a, batch, c0 + lo, request_blocks, request_units);
      const int64_t block = lanes > 0 ? int64_t(uint32_t(entry) / uint32_t(a.batch)) : entry - (s_block_end[lo] - request_blocks);
      int64_t* const out = row_fields() + entry;
      out[kPlanRequest * a.capacity] = c0 + lo;
      out[kPlanBlock * a.capacity] = block;
      out[kPlanUnits * a.capacity] = request_units;
      out[kPlanFirstItem * a.capacity] = s_item_start[lo] + block * (lanes > 0 ? s_before[kItems] : request_units);
    }
    // Piece entry: one thread a piece, so a long request's many pieces are written in parallel.
    if (entry < piece_capacity(a.capacity) && entry >= pieces_before && entry < (s_before[kBlocksPieces] & 0xffffffff)) {
      const int rank = longest_first ? request_of(s_ranked_piece_end) : -1;
      const int lo = longest_first ? s_order[rank] : request_of(s_piece_end);
      const int64_t run_end = longest_first ? s_ranked_piece_end[rank] : s_piece_end[lo];
      int64_t request_blocks, request_units;
      request_work(a, batch, c0 + lo, request_blocks, request_units);
      const int pieces = s_pieces[lo];
      // Its row block's pieces are consecutive, row blocks in order (32-bit: pieces stay below 2^32).
      const uint32_t offset = static_cast<uint32_t>(entry - (run_end - request_blocks * pieces));
      const int block = static_cast<int>(offset / uint32_t(pieces)), k = static_cast<int>(offset % uint32_t(pieces));
      if (s_block_end[lo] - request_blocks + block < a.capacity) {  // only pieces of row blocks with an entry
        int64_t* const piece = piece_fields() + entry;
        piece[kPieceRow * piece_capacity(a.capacity)] = (int64_t(c0 + lo) << 32) | block;
        piece[kPieceUnits * piece_capacity(a.capacity)] = piece_unit_range(request_units, k, pieces);
        piece[kPieceSlot * piece_capacity(a.capacity)] = a.splits > 1 ? int64_t(pieces) << 32 | k : -1;
      }
    }
    __syncthreads();  // the chunk's shared entries are read before the next chunk writes them
    // Every entry of this block is a row block's (so a piece's too: a row block has one or more)
    // and written: only block 0 (the header) needs the totals.
    if (plan_block != 0 && (s_before[kBlocksPieces] >> 32) >= int64_t(plan_block + 1) * kThreads) break;
  }
  clock.mark(kPlanScan);
  const int64_t all_blocks = s_before[kBlocksPieces] >> 32, all_items = s_before[kItems] * (lanes > 0 ? lanes : 1);
  const int64_t all_pieces = s_before[kBlocksPieces] & 0xffffffff;
  const int64_t row_blocks = all_blocks < a.capacity ? all_blocks : a.capacity;
  // More row blocks than the shapes allow (only from indptrs that were not sanitized): no pieces.
  const int64_t total_pieces = all_blocks < a.capacity ? all_pieces : 0;
  if (entry < a.capacity && entry >= row_blocks) {
    int64_t* const out = row_fields() + entry;
    out[kPlanRequest * a.capacity] = a.batch;
    out[kPlanBlock * a.capacity] = 0;
    out[kPlanUnits * a.capacity] = 0;
    out[kPlanFirstItem * a.capacity] = all_items;
  }
  if (entry < a.capacity) partials_written_fields()[entry] = 0;
  if (entry < piece_capacity(a.capacity) && entry >= all_pieces) {
    int64_t* const piece = piece_fields() + entry;
    piece[kPieceRow * piece_capacity(a.capacity)] = int64_t(a.batch) << 32;
    piece[kPieceUnits * piece_capacity(a.capacity)] = 0;
    piece[kPieceSlot * piece_capacity(a.capacity)] = -1;
  }
  if (plan_block == 0 && threadIdx.x == 0) {
    int64_t* const h = a.plan;
    h[kPlanRowBlocks] = row_blocks;
    h[kPlanItems] = all_items;
    h[kPlanHeads] = a.heads;
    h[kPlanCtas] = a.ctas;
    h[kPlanSplits] = a.splits;
    h[kPlanPieces] = total_pieces;
  }
  clock.mark(kPlanWritten);
  clock.print(a.batch);
}

}  // namespace ddtree
