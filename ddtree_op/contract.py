"""The numbers and names every part of ddtree_op agrees on, each defined once.

The CUDA side has the same constants in cutlass_kernels/contract.cuh (namespace ddtree);
tests/test_contract.py checks that the two agree.
"""

from __future__ import annotations

import torch

# One MLA key row (and one query row) is [latent ‖ rope]; V is its first LATENT_DIM columns.
LATENT_DIM = 512
ROPE_DIM = 64
QK_DIM = LATENT_DIM + ROPE_DIM  # 576

# Packed (draft, head) rows per row block: the rows one CTA (or one Triton program by default)
# attends for together, so a gathered KV row serves all of them.
ROWS_PER_BLOCK = 64
KEY_TILE = 64  # keys per tile of the attention loop
UNIT_KEYS = 2 * KEY_TILE  # a unit of work (a pair of tiles): the sm90 kernel's split and share granularity

# Key-range splits per row block at most (both from shapes only).
TRITON_MAX_SPLITS = 64
SM90_MAX_SPLITS = 128

# The persistent schedule's cost of cutting a row block between CTAs, in units: the kernel's
# plan and the Python oracle both compare with it.
CUT_COST_UNITS = 8
PARTIAL_SLOTS_PER_CTA = 2  # a persistent CTA's first and last segment
# Equal shares go lane by lane (row block j of every request, then j + 1; persistent_schedule.py)
# only in batches of at most LANE_SHARES_MAX_BATCH requests (the plan's blocks scan them in one
# pass), and only where the lanes keep at least LANE_SHARES_MIN_USE eighths of the CTAs busy.
LANE_SHARES_MAX_BATCH = 256
LANE_SHARES_MIN_USE = 7

# The schedule plan (int64), made by the preparation from the sanitized batch and read by the
# sm90 kernels: PLAN_HEADER entries, PLAN_FIELDS arrays of one entry per row block
# (`plan_capacity` entries each), PIECE_FIELDS arrays of one entry per piece of the split kernel
# (`piece_capacity` entries each; cutlass_kernels/verify_plan.cuh), then the partials of each row
# block that the running persistent kernel has written (`plan_capacity` entries from
# `plan_partials_written_offset`; 0 between launches: the CTA that writes a row block's last one
# merges them and sets it back, cutlass_kernels/sm90/merge.cuh).
PLAN_HEADER = 8
PLAN_FIELDS = 4
PIECE_FIELDS = 3
MAX_PIECE_BUDGET = 256  # pieces beyond the row blocks, at most: a wave of CTAs on any GPU
# Partial slots of the split kernel per split of the shapes: a row block of a long request may be
# cut into this many times the splits, and its pieces write partials [slot, row].
PIECE_SLOTS_PER_SPLIT = 2
# The split kernel's pieces go longest first (requests by their longest piece, so the hardware's
# dispatch starts them in the first wave) in batches of at most LONGEST_FIRST_MAX_BATCH requests
# (one scan chunk of the plan); a larger batch keeps request order.
LONGEST_FIRST_MAX_BATCH = 256
# Header entries: the choice (1: equal shares, 0: pieces), the row blocks and items (row block,
# unit) of all requests, the CTAs with an equal share, the schedule it was made for, and the
# split kernel's pieces.
PLAN_EQUAL_SHARES = 0
PLAN_ROW_BLOCKS = 1
PLAN_ITEMS = 2
PLAN_USED = 3
PLAN_HEADS = 4
PLAN_CTAS = 5
PLAN_SPLITS = 6
PLAN_PIECES = 7
# Fields of a row block: its request, its block within the request, its units, its first item.
PLAN_REQUEST = 0
PLAN_BLOCK = 1
PLAN_UNITS = 2
PLAN_FIRST_ITEM = 3
# Fields of a piece: its row (request << 32 | block), its units (begin << 32 | end), its partial
# slot (pieces of its row block << 32 | its index among them; -1: the whole row block, written to
# out/lse directly).
PIECE_ROW = 0
PIECE_UNITS = 1
PIECE_SLOT = 2


def plan_capacity(num_tokens, heads, batch):
    """Row blocks a plan has room for, from shapes: each request's last row block may be short."""
    return (num_tokens * heads + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK + batch


def piece_capacity(num_tokens, heads, batch):
    """Pieces a plan has room for: one per row block and MAX_PIECE_BUDGET more (the budget of a
    batch cut into more pieces than row blocks is at most MAX_PIECE_BUDGET)."""
    return plan_capacity(num_tokens, heads, batch) + MAX_PIECE_BUDGET


def plan_partials_written_offset(num_tokens, heads, batch):
    return PLAN_HEADER + PLAN_FIELDS * plan_capacity(num_tokens, heads, batch) + PIECE_FIELDS * piece_capacity(num_tokens, heads, batch)


def plan_numel(num_tokens, heads, batch):
    return plan_partials_written_offset(num_tokens, heads, batch) + plan_capacity(num_tokens, heads, batch)


def split_grid(num_tokens, heads, batch, splits):
    """CTAs of the sm90 split kernel, from shapes: room for every piece the plan can make (the
    row blocks, or the shapes' row blocks times `splits`, at most MAX_PIECE_BUDGET) and one more,
    whose CTAs write the padding rows."""
    nominal = (num_tokens * heads + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    return max(plan_capacity(num_tokens, heads, batch), min(nominal * splits, MAX_PIECE_BUDGET) + 1)

# Compact mask: one bit per draft column, MASK_WORD_BITS per int64 word.
MASK_WORD_BITS = 64
MASK_LAYOUTS = ("full", "qlen", "packed")
# Widest draft count each packed dtype can describe (one bit per draft column).
PACKED_MASK_BITS = {
    torch.uint8: 8,
    torch.int16: 16,
    torch.uint16: 16,
    torch.int32: 32,
    torch.uint32: 32,
    torch.int64: 64,
}

# Values of `backend=`. "auto" walks AUTO_ORDER (backends/__init__.py); DEPRECATED_BACKENDS are
# old names still accepted, with a warning.
BACKENDS = ("reference", "triton", "sm90")
BACKEND_CHOICES = ("auto",) + BACKENDS
DEPRECATED_BACKENDS = {"cutlass": "sm90"}
