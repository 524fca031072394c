// Which request owns a row block of the verify kernel's grid, with its token and key ranges.
//
// A warp looks at 32 requests at a time: lane b loads request b's qo_indptr and verify_indptr
// entries (all loads of a round go out together) and a shuffle scan counts the row blocks before
// it. A request-by-request loop took 0.7-3.5 K cycles at B = 1..32, and the key range after it
// one more dependent round trip (phase clocks, bench/results/2026-11-30_H200x2_9583d81).
#pragma once

#include "../index_view.cuh"

namespace ddtree::sm90 {

struct BlockRequest {
  int request;      // -1: the block lies past every request's rows (it writes padding rows)
  int first_block;  // the request's first row block; for request -1, the row blocks of all requests
  int64_t q_lo, q_hi;
  int kv_lo, kv_hi;
};

// Called by every lane of a whole warp; each warp of a CTA finds the same answer.
template <int kRows>
__device__ __forceinline__ BlockRequest find_block_request(const IndexView& qo_indptr, const int32_t* verify_indptr,
                                                           int batch, int heads, int block) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  int blocks_before = 0;  // row blocks of the requests of earlier rounds
  for (int base = 0; base < batch; base += 32) {
    const int b = base + lane;
    long long q_lo = 0, q_hi = 0;
    int kv_lo = 0, kv_hi = 0;
    if (b < batch) {
      q_lo = qo_indptr[b];
      q_hi = qo_indptr[b + 1];
      kv_lo = verify_indptr[b];
      kv_hi = verify_indptr[b + 1];
    }
    const int blocks = static_cast<int>(((q_hi - q_lo) * heads + kRows - 1) / kRows);
    int end = blocks;  // inclusive scan over the lanes: row blocks up to and including request b
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int below = __shfl_up_sync(kAll, end, d);
      if (lane >= d) end += below;
    }
    end += blocks_before;
    // Empty requests own no block, as block >= end - 0 and block < end cannot both hold.
    const unsigned owners = __ballot_sync(kAll, block >= end - blocks && block < end);
    if (owners != 0) {
      const int owner = __ffs(owners) - 1;
      return {base + owner, __shfl_sync(kAll, end - blocks, owner), __shfl_sync(kAll, q_lo, owner),
              __shfl_sync(kAll, q_hi, owner), __shfl_sync(kAll, kv_lo, owner), __shfl_sync(kAll, kv_hi, owner)};
    }
    blocks_before = __shfl_sync(kAll, end, 31);
  }
  return {-1, blocks_before, 0, 0, 0, 0};
}

}  // namespace ddtree::sm90
