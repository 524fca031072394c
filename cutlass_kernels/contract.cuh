// The numbers every CUDA kernel of ddtree_op agrees on with the Python side, each defined once.
// ddtree_op/contract.py holds the same values; tests/test_contract.py checks that the two agree.
// Plain constexpr values: usable in host and device code, no dependency on torch or CUTLASS.
#pragma once

#include <cstdint>

namespace ddtree {

// One MLA key (and query) row is [latent | rope]; V is its first kLatentDim columns.
constexpr int kLatentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kQkDim = kLatentDim + kRopeDim;  // 576

// Packed (draft, head) rows per row block (a CTA's rows); keys per tile; a unit of work is a
// pair of tiles (the sm90 kernel's split and share granularity).
constexpr int kRowsPerBlock = 64;
constexpr int kKeyTile = 64;
constexpr int kUnitKeys = 2 * kKeyTile;

// Key-range splits per row block of the sm90 split kernel, at most.
constexpr int kSm90MaxSplits = 128;

// Persistent schedule: what cutting a row block between CTAs costs, in units (the plan compares
// with it), and the partial slots of one CTA (its first and last segment).
constexpr int kCutCostUnits = 8;
constexpr int kPartialSlotsPerCta = 2;
// Equal shares lane by lane (verify_plan.cuh) in batches of at most kLaneSharesMaxBatch requests
// (one scan chunk), where the lanes keep at least kLaneSharesMinUse eighths of the CTAs busy.
constexpr int kLaneSharesMaxBatch = 256;
constexpr int kLaneSharesMinUse = 7;

// The schedule plan (int64; layout and meaning: verify_plan.cuh): kPlanHeader entries,
// kPlanFields arrays of one entry per row block, then kPieceFields arrays of one entry per piece
// of the split kernel (room for the row blocks and kMaxPieceBudget more), then one more entry per
// row block: the partials of it that the running persistent kernel has written.
constexpr int kPlanHeader = 8;
constexpr int kPlanFields = 4;
constexpr int kPieceFields = 3;
constexpr int kMaxPieceBudget = 256;
// Partial slots of the split kernel per split of the shapes: a row block of a long request may be
// cut into this many times the splits, and its pieces write partials [slot, row].
constexpr int kPieceSlotsPerSplit = 2;
// The split kernel's pieces go longest first (requests by their longest piece, so the hardware's
// dispatch starts them in the first wave) in batches of at most kLongestFirstMaxBatch requests
// (one scan chunk); a larger batch keeps request order.
constexpr int kLongestFirstMaxBatch = 256;
// Header entries.
constexpr int kPlanEqualShares = 0;
constexpr int kPlanRowBlocks = 1;
constexpr int kPlanItems = 2;
constexpr int kPlanUsed = 3;
constexpr int kPlanHeads = 4;
constexpr int kPlanCtas = 5;
constexpr int kPlanSplits = 6;
constexpr int kPlanPieces = 7;
// Fields of a row block.
constexpr int kPlanRequest = 0;
constexpr int kPlanBlock = 1;
constexpr int kPlanUnits = 2;
constexpr int kPlanFirstItem = 3;
// Fields of a piece: its row (request << 32 | block), its units (begin << 32 | end), its partial
// slot (pieces of its row block << 32 | its index among them; -1: the whole row block, written to
// out/lse directly).
constexpr int kPieceRow = 0;
constexpr int kPieceUnits = 1;
constexpr int kPieceSlot = 2;

// Compact mask: one bit per draft column, kMaskWordBits per int64 word. A packed mask holds at
// most kMaxPackedMaskBits drafts (its widest dtype, int64).
constexpr int kMaskWordBits = 64;
constexpr int kMaxPackedMaskBits = 64;

// Values of the prep ops' `layout` argument, in contract.py's MASK_LAYOUTS order.
constexpr const char* kMaskLayouts[] = {"full", "qlen", "packed"};

}  // namespace ddtree
