"""Device-side preparation of a verify step: combined indices and compact tree masks.

All functions are plain tensor programs (searchsorted, gathers, shifts) whose output shapes
depend on input shapes only. They read no value on the host, so they run unchanged on CPU and
CUDA, inside `torch.compile` graphs and inside captured CUDA graphs. They are the CPU
implementations of `ddtree::build_verify_indices`, `ddtree::convert_tree_mask` and
`ddtree::prepare_verify`; on CUDA the same ops run fused kernels (cutlass_kernels/
verify_indices.cu, tree_mask.cu, verify_prep.cu), tested against these.

Bounds safety: whatever the index values, they read only inside their tensors and size every
temporary from shapes. Bad values are sanitized by the rules of `SanitizedBatch` (the same as
cutlass_kernels/verify_status.cuh, bit for bit), and `prepare_verify_checked` records what it
sanitized in the optional status (status.py).
"""

from __future__ import annotations

import torch

from .contract import (CUT_COST_UNITS, LANE_SHARES_MAX_BATCH, LANE_SHARES_MIN_USE, LONGEST_FIRST_MAX_BATCH, MASK_LAYOUTS,
                       MAX_PIECE_BUDGET, PACKED_MASK_BITS, PIECE_FIELDS, PIECE_ROW, PIECE_SLOT, PIECE_SLOTS_PER_SPLIT,
                       PIECE_UNITS, PLAN_BLOCK, PLAN_CTAS, PLAN_EQUAL_SHARES, PLAN_FIELDS, PLAN_FIRST_ITEM, PLAN_HEADER,
                       PLAN_HEADS, PLAN_ITEMS, PLAN_PIECES, PLAN_REQUEST, PLAN_ROW_BLOCKS, PLAN_SPLITS, PLAN_UNITS,
                       PLAN_USED, ROWS_PER_BLOCK, UNIT_KEYS, piece_capacity, plan_capacity)
from . import status as status_layout
from .status import FAULTS, write_keys

# Signed dtype of the same width, so the raw bits can be read with ops every backend has.
_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32}


CLAMP_HIGH = 2**31 - 1  # raw index values are clamped to [-1, CLAMP_HIGH] before any comparison


def _clamped(values: torch.Tensor) -> torch.Tensor:
    return values.long().clamp(-1, CLAMP_HIGH)


def _gather_or_zero(values: torch.Tensor, index: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """values[index] where `valid` (default: everywhere), else 0; reads only inside `values`."""
    if values.numel() == 0:
        return torch.zeros_like(index)
    # Gather first, convert after: the mask buffer may be far larger than what is read.
    got = values[index.clamp(0, values.numel() - 1)].long()
    return got if valid is None else torch.where(valid, got, torch.zeros_like(got))


def _first(flags: torch.Tensor, positions: torch.Tensor, none: int) -> torch.Tensor:
    """The lowest position where `flags` holds (`none` if it never does), as a 0-d tensor."""
    return torch.where(flags, positions, torch.full_like(positions, none)).min() if flags.numel() else positions.new_tensor(none)


class SanitizedBatch:
    """The batch every kernel reads, from raw indptrs (the rules of cutlass_kernels/verify_status.cuh):

    - qo_indptr is trusted up to its first bad entry k_qo (qo[0] != 0, decreasing, past
      min(T_pad, out_cache_loc.numel()), or a request with more drafts than the compact mask has
      columns); later entries repeat the last trusted one, so those rows become padding.
    - kv_indptr is trusted up to its first bad entry k_kv (outside [0, N], decreasing).
    - Requests b >= min(k_qo, k_kv) - 1 are void: no prefix, n_b draft keys of slot -1, mask 0.

    `faults` holds, per pointwise fault kind of the status, a bool tensor and the positions it indexes.
    """

    def __init__(self, qo_indptr, kv_indptr, mask_indptr, num_rows, num_draft_slots, num_prefix, draft_cap,
                 max_draft_len=0, packed_width=0):
        batch = qo_indptr.numel() - 1
        device = qo_indptr.device
        entry = torch.arange(batch + 1, device=device)
        first = entry == 0
        q = _clamped(qo_indptr)
        k = _clamped(kv_indptr[: batch + 1])
        zero = q.new_zeros(1)
        q_prev = torch.cat([zero, q[:-1]])
        k_prev = torch.cat([zero, k[:-1]])
        drafts = q - q_prev
        max_rows = min(num_rows, num_draft_slots)
        q_bad = torch.where(first, q != 0, q < q_prev) | (q > max_rows) | (~first & (drafts > draft_cap))
        k_bad = torch.where(first, k < 0, k < k_prev) | (k > num_prefix)
        k_qo = _first(q_bad, entry, batch + 1)
        k_kv = _first(k_bad, entry, batch + 1)
        self.first_void = (torch.minimum(k_qo, k_kv) - 1).clamp(min=0)
        last_trusted = q[(k_qo - 1).clamp(min=0)] * (k_qo > 0)
        self.qo = torch.where(entry < k_qo, q, last_trusted)  # int64 [B+1]: monotone, in [0, T_pad]
        request = entry[:-1]
        self.void = request >= self.first_void
        self.num_draft = self.qo[1:] - self.qo[:-1]
        self.prefix_len = torch.where(self.void, torch.zeros_like(request), k[1:] - k[:-1])
        self.kv = k  # raw (clamped) kv_indptr; trusted where requests are not void
        self.verify_indptr = torch.zeros(batch + 1, dtype=torch.long, device=device)
        torch.cumsum(self.prefix_len + self.num_draft, 0, out=self.verify_indptr[1:])
        self.batch = batch

        later = ~first
        request_of_entry = (entry - 1).clamp(min=0)
        faults = {
            "qo_start": (first & (q != 0), entry),
            "qo_order": (later & (q < q_prev), entry),
            "kv_order": (later & (k < k_prev), entry),
            "qo_rows": (q > num_rows, entry),
            "qo_slots": (q > num_draft_slots, entry),
            "kv_range": ((k < 0) | (k > num_prefix), entry),
            "mask_width": (later & (drafts > packed_width) if packed_width else torch.zeros_like(first), request_of_entry),
            "draft_count": (later & (((drafts > max_draft_len) if max_draft_len else torch.zeros_like(first))
                                     | (drafts > draft_cap)), request_of_entry),
        }
        if mask_indptr is not None:
            mi = mask_indptr[: batch + 1].long()
            faults["mask_indptr_order"] = (later & (mi < torch.cat([mi.new_zeros(1), mi[:-1]])), entry)
        self.faults = faults


def _verify_indices(s: SanitizedBatch, kv_indices, out_cache_loc, num_slots):
    """verify_indices int32 [N + T] of a sanitized batch, and the slot faults (flags, positions)."""
    device = s.qo.device
    total = kv_indices.numel() + out_cache_loc.numel()
    pos = torch.arange(total, device=device)
    if s.batch == 0:
        none = torch.zeros(total, dtype=torch.bool, device=device)
        return torch.zeros(total, dtype=torch.int32, device=device), (none, pos), (none, pos)
    vi = s.verify_indptr
    req = torch.searchsorted(vi[1:], pos, right=True).clamp_(max=s.batch - 1)
    used = pos < vi[s.batch]
    offset = pos - vi[req]
    prefix_len = s.prefix_len[req]
    from_prefix = offset < prefix_len
    live = used & ~s.void[req]
    prefix_at = s.kv[req] + offset
    draft_at = s.qo[req] + offset - prefix_len
    slots = torch.where(from_prefix, _gather_or_zero(kv_indices, prefix_at, live & from_prefix),
                        _gather_or_zero(out_cache_loc, draft_at, live & ~from_prefix))
    bad = live & ((slots < 0) | (slots >= num_slots))
    slots = torch.where(bad | (used & ~live), torch.full_like(slots, -1), slots)
    slots = torch.where(used, slots, torch.zeros_like(slots))
    return slots.int(), (bad & from_prefix, prefix_at), (bad & ~from_prefix, draft_at)


def build_verify_indices(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request b: `[kv_indices[kv_indptr[b]:kv_indptr[b+1]] ‖ out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]]`.

    Returns (verify_indptr int32 [B+1], verify_indices int32 [N + T]); entries of verify_indices
    past verify_indptr[B] are 0. The batch is sanitized with what this op knows (no T_pad, no S:
    only slots outside [0, 2^31 - 1) become -1); `prepare_verify_checked` is the bounds-checked path.
    """
    s = SanitizedBatch(qo_indptr, kv_indptr, None, CLAMP_HIGH, out_cache_loc.numel(), kv_indices.numel(), CLAMP_HIGH)
    verify_indices, _, _ = _verify_indices(s, kv_indices, out_cache_loc, CLAMP_HIGH)
    return s.verify_indptr.int(), verify_indices


def _mask_words(s: SanitizedBatch, tree_mask, mask_indptr, layout, num_rows, words_per_row):
    """Compact mask words of a sanitized batch, and the requests that read outside the mask."""
    device = s.qo.device
    batch = s.batch
    no_fault = torch.zeros(max(batch, 0), dtype=torch.bool, device=device)
    if batch == 0:
        return torch.zeros(num_rows, words_per_row, dtype=torch.long, device=device), no_fault
    qo = s.qo
    row = torch.arange(num_rows, device=device)
    req = torch.searchsorted(qo[1:], row, right=True)
    row_valid = req < batch
    req = req.clamp_(max=batch - 1)
    row_valid = row_valid & ~s.void[req]
    draft_len = s.num_draft[req]
    draft_row = row - qo[req]
    col = torch.arange(words_per_row * 64, device=device)
    visible_cell = row_valid[:, None] & (col[None, :] < draft_len[:, None])

    if layout == "packed":
        raw = tree_mask.view(_SIGNED_VIEW.get(tree_mask.dtype, tree_mask.dtype)).reshape(-1)
        width = PACKED_MASK_BITS[tree_mask.dtype]
        inside_row = row < raw.numel()
        word = _gather_or_zero(raw, row, inside_row)
        bits = (word[:, None] >> col.clamp(max=63)[None, :]) & 1
        bits = bits.bool() & (col[None, :] < width)
        outside_row = row_valid & (draft_len > 0) & ~inside_row
    else:
        flat = tree_mask.reshape(-1)
        if layout == "full":
            prefix_len = s.prefix_len[req]
            row_start = mask_indptr.long()[req] + draft_row * (prefix_len + draft_len) + prefix_len
        elif layout == "qlen":
            if mask_indptr is not None:
                block_start = mask_indptr.long()[:batch]
            else:
                sizes = s.num_draft ** 2
                block_start = torch.cumsum(sizes, 0) - sizes
            row_start = block_start[req] + draft_row * draft_len
        else:
            raise ValueError(f"mask_layout must be one of {MASK_LAYOUTS}, got {layout!r}")
        at = row_start[:, None] + col[None, :]
        inside = (at >= 0) & (at < flat.numel())
        bits = _gather_or_zero(flat, at, inside & visible_cell) != 0
        outside_row = (visible_cell & ~inside).any(1)
    bits = bits & visible_cell
    shifts = torch.arange(64, device=device)
    words = (bits.view(num_rows, words_per_row, 64).long() << shifts).sum(-1)
    outside = torch.zeros(batch, dtype=torch.long, device=device).index_add_(0, req, outside_row.long()) > 0
    return words, outside


def _packed_width(tree_mask: torch.Tensor, layout: str) -> int:
    return PACKED_MASK_BITS[tree_mask.dtype] if layout == "packed" else 0


def convert_tree_mask(
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    layout: str,
    num_rows: int,
    words_per_row: int,
) -> torch.Tensor:
    """Compact tree mask: int64 [num_rows, words_per_row]; bit j of word w in row t says that
    draft row t sees draft column 64*w + j of its own request. Padding rows, void requests and
    columns past the request's draft count are 0; cells outside the mask read as 0. The batch is
    sanitized with what this op knows (rows bounded by num_rows, prefix ends unbounded).
    """
    s = SanitizedBatch(qo_indptr, kv_indptr, None, num_rows, CLAMP_HIGH, CLAMP_HIGH, 64 * words_per_row,
                       packed_width=_packed_width(tree_mask, layout))
    return _mask_words(s, tree_mask, mask_indptr, layout, num_rows, words_per_row)[0]


def _ceil_div(a: torch.Tensor, b) -> torch.Tensor:
    return torch.div(a + (b - 1), b, rounding_mode="floor")


_UNCUT = 1 << 62  # piece units that cut nothing (verify_plan.cuh's kUncut)


def _pieces_of(units: torch.Tensor, piece_units) -> torch.Tensor:
    return torch.where(units > piece_units, _ceil_div(units, piece_units), 1)


def _split_piece_units(blocks: torch.Tensor, units: torch.Tensor, capacity: int, batch: int, ctas: int,
                       splits: int) -> torch.Tensor:
    """The split kernel's piece length (verify_plan.cuh's split_piece_units): the least c in
    [max(ceil(work / budget), ceil(longest / (PIECE_SLOTS_PER_SPLIT * splits))), longest] for
    which every row block cut into pieces of at most c units makes no more pieces than the budget;
    a binary search of fixed length (units < 2^25)."""
    if splits <= 1:
        return units.new_tensor(_UNCUT)
    work, rows = (blocks * units).sum(), blocks.sum()
    longest = torch.where(blocks > 0, units, 0).max()
    budget = torch.clamp(rows, min=min(max(capacity - batch, 0) * splits, min(ctas, MAX_PIECE_BUDGET)))
    lo = torch.where(budget > 0, _ceil_div(work, budget.clamp(min=1)), 1)
    lo = torch.maximum(lo, _ceil_div(longest, PIECE_SLOTS_PER_SPLIT * splits)).clamp(min=1)
    hi = torch.maximum(longest, lo)
    for _ in range(26):
        mid = (lo + hi) // 2
        fits = (blocks * _pieces_of(units, mid)).sum() <= budget
        searching = lo < hi
        hi = torch.where(searching & fits, mid, hi)
        lo = torch.where(searching & ~fits, mid + 1, lo)
    return hi


def verify_plan(qo_indptr: torch.Tensor, verify_indptr: torch.Tensor, num_rows: int, heads: int, ctas: int,
                splits: int) -> torch.Tensor:
    """The sm90 kernels' schedule plan of a batch, for `ctas` CTAs and `splits` key splits per row
    block: int64 [plan_numel(num_rows, heads, B)] in the layout of contract.PLAN_* and PIECE_* (the
    CPU twin of cutlass_kernels/verify_plan.cuh, bit for bit wherever the row blocks fit the
    shapes, as they do in every sanitized batch). The preparation makes it from the sanitized
    indptrs; what it means is backends/sm90/persistent_schedule.py and schedule.py. A tensor
    program: no host reads."""
    device = qo_indptr.device
    batch = qo_indptr.numel() - 1
    capacity = plan_capacity(num_rows, heads, batch)
    qo, vi = qo_indptr[: batch + 1].long(), verify_indptr[: batch + 1].long()
    zero = qo.new_zeros(1)
    # One entry past the last request (zero work), so that row blocks past the end index it.
    blocks = torch.cat([_ceil_div((qo[1:] - qo[:-1]).clamp(min=0) * heads, ROWS_PER_BLOCK), zero])
    units = torch.cat([_ceil_div((vi[1:] - vi[:-1]).clamp(min=0), UNIT_KEYS), zero])
    items = blocks * units
    block_end = torch.cumsum(blocks, 0)
    item_start = torch.cumsum(items, 0) - items
    total = items.sum()
    row_blocks = block_end[-1].clamp(max=capacity)
    # The choice: equal shares where the longest piece times the waves of pieces exceeds a share
    # by more than a cut costs, or where pieces with splits would not fit 2 partial slots per CTA.
    longest = _ceil_div(torch.where(blocks > 0, units, 0).max(), splits)
    used = total.clamp(max=ctas)
    share = _ceil_div(total, used.clamp(min=1))
    waves = _ceil_div(row_blocks * splits, ctas)
    pieces_fit = (row_blocks * splits <= 2 * ctas) | (splits == 1)
    equal = (total > 0) & (~pieces_fit | (share + CUT_COST_UNITS < waves * longest))
    # Equal shares lane by lane (persistent_schedule.share_lanes): every request R row blocks.
    lanes = blocks[0]  # the first request's (with no request, the entry past the last: 0)
    parts = torch.minimum(torch.div(ctas, lanes.clamp(min=1), rounding_mode="floor"),
                          torch.div(total, lanes.clamp(min=1), rounding_mode="floor"))
    by_lane = (equal & (batch <= LANE_SHARES_MAX_BATCH) & (lanes >= 1) & (blocks[:batch] == lanes).all()
               & (block_end[-1] <= capacity) & (parts >= 1) & (8 * lanes * parts >= LANE_SHARES_MIN_USE * ctas))
    used = torch.where(by_lane, lanes * parts, used)
    row_block = torch.arange(capacity, device=device)
    request = torch.searchsorted(block_end[:-1], row_block, right=True)
    live = row_block < row_blocks
    block = torch.where(live, row_block - (block_end[request] - blocks[request]), 0)
    request = torch.where(live, request, batch)
    first_item = torch.where(live, item_start[request] + block * units[request], total)
    # The row-block fields lane by lane: entry e is block e // B of request e % B (the pieces
    # below stay in request order).
    lane_request = row_block % max(batch, 1)
    lane_block = torch.div(row_block, max(batch, 1), rounding_mode="floor")
    unit_start = torch.cumsum(units, 0) - units
    lane_first = lane_block * torch.div(total, lanes.clamp(min=1), rounding_mode="floor") + unit_start[lane_request]
    in_lanes = by_lane & live
    field_request = torch.where(in_lanes, lane_request, request)
    field_block = torch.where(in_lanes, lane_block, block)
    first_item = torch.where(in_lanes, lane_first, first_item)
    # The split kernel's pieces: row block r of request b in pieces[b] pieces from first_piece[r],
    # requests longest piece first (ties in request order) in batches of one scan chunk.
    pieces = _pieces_of(units, _split_piece_units(blocks, units, capacity, batch, ctas, splits))
    request_pieces = blocks * pieces
    all_pieces = request_pieces.sum()
    if batch <= LONGEST_FIRST_MAX_BATCH:
        longest_piece = torch.where(blocks > 0, _ceil_div(units, pieces), 0)[:batch]
        order = torch.sort(longest_piece, descending=True, stable=True).indices
    else:
        order = torch.arange(batch, device=device)
    ranked_pieces = request_pieces[order]
    request_first_piece = torch.zeros_like(request_pieces)
    request_first_piece[order] = torch.cumsum(ranked_pieces, 0) - ranked_pieces
    first_piece = torch.where(live, request_first_piece[request] + block * pieces[request], all_pieces)
    slots = piece_capacity(num_rows, heads, batch)
    piece = torch.arange(slots, device=device)
    # Its row block, among the row blocks in piece order and one past them (the capacity may be 0).
    by_first_piece = torch.sort(first_piece, stable=True).indices
    starts = torch.cat([first_piece[by_first_piece], all_pieces.reshape(1)])
    owner = (torch.searchsorted(starts, piece, right=True) - 1).clamp(min=0)
    owner_request = torch.cat([request[by_first_piece], request.new_full((1,), batch)])[owner]
    owner_block = torch.cat([block[by_first_piece], block.new_zeros(1)])[owner]
    real = piece < all_pieces
    k, count, whole = piece - starts[owner], pieces[owner_request], units[owner_request]
    q, r = whole // count, whole % count  # the first r pieces one unit longer
    begin = k * q + torch.minimum(k, r)
    piece_row = torch.where(real, owner_request * 2**32 + owner_block, batch * 2**32)
    piece_units = torch.where(real, begin * 2**32 + begin + q + (k < r).long(), 0)
    piece_slot = torch.where(real & (splits > 1), count * 2**32 + k, -1)
    header = torch.zeros(PLAN_HEADER, dtype=torch.long, device=device)
    header[PLAN_EQUAL_SHARES] = equal.long()
    header[PLAN_ROW_BLOCKS] = row_blocks
    header[PLAN_ITEMS] = total
    header[PLAN_USED] = used
    header[PLAN_HEADS], header[PLAN_CTAS], header[PLAN_SPLITS] = heads, ctas, splits
    header[PLAN_PIECES] = torch.where(block_end[-1] < capacity, all_pieces, 0)
    fields = [None] * PLAN_FIELDS
    fields[PLAN_REQUEST], fields[PLAN_BLOCK], fields[PLAN_FIRST_ITEM] = field_request, field_block, first_item
    fields[PLAN_UNITS] = torch.where(live, units[field_request], 0)
    piece_fields = [None] * PIECE_FIELDS
    piece_fields[PIECE_ROW], piece_fields[PIECE_UNITS], piece_fields[PIECE_SLOT] = piece_row, piece_units, piece_slot
    return torch.cat([header] + fields + piece_fields + [torch.zeros_like(first_item)])  # + the partials written


def _write_status(status, faults: dict, values: dict, publish: bool = True) -> None:
    """The status from per-kind (flags, positions) and the raw values per kind, as a tensor program
    (no host reads): the keys (status.write_keys), then, with `publish`, status[:WORKSPACE] from
    them (status.publish, as the CUDA launch that publishes does); without it the attention op
    that follows publishes."""
    device = status.device
    big = CLAMP_HIGH
    firsts = []
    for name, _, _ in FAULTS:
        if name in faults:
            flags, positions = faults[name]
            firsts.append(_first(flags, positions.long().clamp(0, big - 1), big))
        else:
            firsts.append(torch.tensor(big, device=device))
    first = torch.stack(firsts)  # [K]
    present = first < big
    value_per_kind = torch.stack([values[name](first[k]) for k, (name, _, _) in enumerate(FAULTS)])
    write_keys(status, present, first, value_per_kind)  # which saturates the values to int32
    if publish:
        status_layout.publish(status)


def _raw_at(values: torch.Tensor):
    def read(position):
        if values.numel() == 0:
            return position.new_tensor(0)
        return values[position.clamp(0, values.numel() - 1)].long()
    return read


def prepare_verify_checked(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None,
    layout: str,
    num_rows: int,
    words_per_row: int,
    num_slots: int = CLAMP_HIGH,
    max_draft_len: int = 0,
    status: torch.Tensor | None = None,
    plan: torch.Tensor | None = None,
    heads: int = 0,
    plan_ctas: int = 1,
    plan_splits: int = 1,
    publish_status: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify step's preparation, validated and sanitized (the CPU implementation of
    `ddtree::prepare_verify`): (verify_indptr, verify_indices, mask_words, qo_indptr) where
    qo_indptr is the sanitized one (int32 [B+1]) that the attention op reads. Slots outside
    [0, num_slots) become -1. Where a value had to be sanitized, `status` (status.py) records it:
    published, or with `publish_status` False left in its keys for the attention op to publish.
    `plan` (int64 [plan_numel(num_rows, heads, B)]), when given, receives the schedule plan of the
    sanitized batch for `heads` heads, `plan_ctas` CTAs and `plan_splits` splits (verify_plan)."""
    packed_width = _packed_width(tree_mask, layout)
    reads_mask_indptr = mask_indptr if packed_width == 0 else None
    s = SanitizedBatch(qo_indptr, kv_indptr, reads_mask_indptr, num_rows, out_cache_loc.numel(), kv_indices.numel(),
                       64 * words_per_row, max_draft_len, packed_width)
    verify_indices, kv_slot, draft_slot = _verify_indices(s, kv_indices, out_cache_loc, num_slots)
    mask_words, mask_outside = _mask_words(s, tree_mask, mask_indptr, layout, num_rows, words_per_row)
    if status is not None:
        faults = dict(s.faults, kv_slot=kv_slot, draft_slot=draft_slot,
                      mask_range=(mask_outside, torch.arange(s.batch, device=mask_outside.device)))
        qo_raw = _raw_at(qo_indptr)
        numel = tree_mask.numel()
        values = {
            "qo_start": qo_raw, "qo_order": qo_raw, "qo_rows": qo_raw, "qo_slots": qo_raw,
            "kv_order": _raw_at(kv_indptr), "kv_range": _raw_at(kv_indptr),
            "kv_slot": _raw_at(kv_indices), "draft_slot": _raw_at(out_cache_loc),
            "mask_width": lambda p: qo_raw(p + 1) - qo_raw(p), "draft_count": lambda p: qo_raw(p + 1) - qo_raw(p),
            "mask_indptr_order": _raw_at(reads_mask_indptr if reads_mask_indptr is not None else qo_indptr),
            "mask_range": lambda p: p.new_tensor(numel),
        }
        _write_status(status, faults, values, publish_status)
    if plan is not None:
        plan.copy_(verify_plan(s.qo, s.verify_indptr, num_rows, heads, plan_ctas, plan_splits))
    return s.verify_indptr.int(), verify_indices, mask_words, s.qo.int()


def prepare_verify(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    mask_indptr: torch.Tensor | None,
    layout: str,
    num_rows: int,
    words_per_row: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(verify_indptr, verify_indices, mask_words) of `prepare_verify_checked` without S (only
    slots outside [0, 2^31 - 1) become -1) and without status."""
    return prepare_verify_checked(qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, layout,
                                  num_rows, words_per_row)[:3]


# Paged KV (ddtree_op/paged.py): the block table as slot lists, which prepare_verify then checks.


def paged_lengths(block_table, cache_seqlens, qo_indptr, page_size, num_rows):
    """Per request, from the raw arguments: (qo, keys, fits) with qo the draft-row indptr made
    monotone inside [0, num_rows] (int64 [B+1]), keys the key count (int64 [B]) and fits whether
    the request's positions fit its table row and its drafts (bool [B])."""
    batch = qo_indptr.numel() - 1
    capacity = block_table.shape[1] * page_size
    qo = torch.cummax(qo_indptr.long().clamp(0, num_rows), 0).values
    num_draft = qo[1:] - qo[:-1]
    seqlen = cache_seqlens[:batch].long()
    fits = (seqlen >= num_draft) & (seqlen <= capacity)
    keys = torch.where(fits, seqlen, num_draft)
    return qo, keys, fits


def paged_slot_lists(block_table, cache_seqlens, qo_indptr, page_size, num_pages, num_rows):
    """The CPU implementation of `ddtree::paged_slot_lists` (a tensor program, no host reads): the
    paged batch in `mla_tree_verify`'s layout, (kv_indptr int32 [B+1], kv_indices int32
    [B * max_pages * page_size], out_cache_loc int32 [num_rows]), with the slots of every
    request's prefix positions and of its draft positions; slot -1 where the page id is out of
    range or the request does not fit (its prefix is then empty). kv_indices past kv_indptr[B]
    is unspecified (the CUDA kernel leaves it unwritten)."""
    device = qo_indptr.device
    batch = qo_indptr.numel() - 1
    max_pages = block_table.shape[1]
    qo, keys, fits = paged_lengths(block_table, cache_seqlens, qo_indptr, page_size, num_rows)
    num_draft = qo[1:] - qo[:-1]
    prefix = torch.where(fits, keys - num_draft, torch.zeros_like(keys))
    kv_indptr = torch.zeros(batch + 1, dtype=torch.long, device=device)
    torch.cumsum(prefix, 0, out=kv_indptr[1:])

    def slots_at(req, pos):
        column = (pos // page_size).clamp(0, max(max_pages - 1, 0))
        page = block_table[req, column].long() if max_pages > 0 else torch.full_like(pos, -1)
        used = fits[req] & (page >= 0) & (page < num_pages)
        return torch.where(used, page * page_size + pos % page_size, torch.full_like(pos, -1))

    kv_indices = torch.full((batch * max_pages * page_size,), -1, dtype=torch.long, device=device)
    out_cache_loc = torch.full((num_rows,), -1, dtype=torch.long, device=device)
    if batch > 0:
        entry = torch.arange(kv_indices.numel(), device=device)
        req = torch.searchsorted(kv_indptr[1:], entry, right=True).clamp_(max=batch - 1)
        kv_indices = torch.where(entry < kv_indptr[batch], slots_at(req, entry - kv_indptr[req]), kv_indices)
        row = torch.arange(num_rows, device=device)
        req = torch.searchsorted(qo[1:], row, right=True).clamp_(max=batch - 1)
        in_batch = (row >= qo[0]) & (row < qo[batch])
        out_cache_loc = torch.where(in_batch, slots_at(req, prefix[req] + row - qo[req]), out_cache_loc)
    return kv_indptr.int(), kv_indices.int(), out_cache_loc.int()
