// The tree mask as a policy of the kernel: which of a tile's 64 key columns each of a thread's
// two rows sees. Prefix keys are visible to every row; draft key j to draft row i iff bit j of
// row i's compact mask words is set; a key without a slot (slot id < 0: past the range, or an
// out-of-range id that preparation replaced) is visible to none.
#pragma once

#include <cstdint>

namespace ddtree::sm90 {

// Visibility bits of 64 consecutive key columns whose first one is draft column `first_draft`
// (negative: the tile starts -first_draft columns before the drafts, in the prefix, all visible).
// `words` is the row's compact mask: bit d of word d / 64 = draft column d visible.
__device__ __forceinline__ uint64_t draft_visibility(const int64_t* words, int first_draft, int num_draft) {
  if (first_draft < 0) {
    const int prefix_cols = -first_draft;  // 1..63
    return ((1ull << prefix_cols) - 1) | (static_cast<uint64_t>(words[0]) << prefix_cols);
  }
  const int w = first_draft / 64, shift = first_draft % 64;
  uint64_t bits = static_cast<uint64_t>(words[w]) >> shift;
  if (shift != 0 && (w + 1) * 64 < num_draft) bits |= static_cast<uint64_t>(words[w + 1]) << (64 - shift);
  return bits;
}

struct TreeMask {
  const int64_t* mask_words;  // [T, W] compact words of the request's draft rows
  int64_t mask_stride;
  int64_t q_lo;               // the request's first token
  int heads, num_draft, num_rows, prefix_len;

  // The tree's bits of the tile starting at key kv0 (< the request's keys) for packed row
  // `row` (< num_rows): a tile that reaches the drafts reads two mask words at most.
  __device__ __forceinline__ uint64_t row_bits(int kv0, int row) const {
    if (kv0 + 64 <= prefix_len) return ~uint64_t(0);
    return draft_visibility(mask_words + (q_lo + row / heads) * mask_stride, kv0 - prefix_len, num_draft);
  }

  // Bits of the tile starting at key kv0 for rows row and row + 8 of the block (packed rows
  // row_base + ...), ANDed with the tile's keys that have a slot.
  __device__ __forceinline__ void tile_bits(int kv0, int row_base, int my_row, uint64_t key_slots,
                                            uint64_t (&bits)[2]) const {
    bits[0] = bits[1] = key_slots;
    if (kv0 + 64 <= prefix_len) return;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = row_base + my_row + 8 * j;
      if (row < num_rows) bits[j] &= row_bits(kv0, row);
    }
  }
};

}  // namespace ddtree::sm90
