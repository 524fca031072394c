"""The verify step's status: what was wrong with its index values, recorded on the device.

The preparation launch validates and sanitizes every index value (see `prep.py`); where it had
to sanitize, it records the fault in an optional caller-owned int32 tensor instead of raising,
so the step never syncs and stays valid inside captured CUDA graphs and `torch.compile`:

    status = ddtree_op.new_status(device)          # once; zeros
    out, lse = ddtree_op.mla_tree_verify(..., status=status)   # every step (captured or not)
    ddtree_op.raise_on_status(status)              # after the step, when the caller syncs anyway

Layout (int32 [STATUS_SIZE]), rewritten by every call that is given it:
  [0] fault bits, 1 << kind (0: the step was clean)
  [1] the lowest kind whose bit is set, -1 if none; [2] its first position; [3] the raw value
      there (saturated to int32)
  [4 + k] the first position of kind k, -1 if none
  [16:] workspace: zeros between calls, never written by the caller. From its first 8-byte
      aligned word (key_word), one 64-bit key per kind, ~(position << 32 | uint32(value)) (0:
      none), then a 64-bit ticket.
The preparation records each fault's key (the earliest position wins, its value with it); in a
verify step the attention launch that follows publishes [0:16) from the keys and clears them, so
the preparation's blocks need not wait for one another (the preparation op alone publishes in its
last block, found by the ticket). One call at a time per status tensor (calls on one stream, as a
step's layers are, may share it: each rewrites it, and they all see the same index values).
Positions index the argument the kind names (qo_indptr entries, kv_indices entries, requests...).
Where the keys start depends on the tensor's address, so the preparation and the launch that
publishes are given the same tensor (as the entry points do). The same layout is defined in
cutlass_kernels/status.cuh.
"""

from __future__ import annotations

import torch

STATUS_SIZE = 48
BITS, KIND, POSITION, VALUE, POSITIONS = 0, 1, 2, 3, 4
WORKSPACE = 16

# (kind name, argument named by the error, what the position indexes); in the order
# check_verify_inputs reports them (the lowest kind wins).
FAULTS = (
    ("qo_start", "qo_indptr", "entry"),
    ("qo_order", "qo_indptr", "entry"),
    ("kv_order", "kv_indptr", "entry"),
    ("qo_rows", "q", "entry of qo_indptr"),
    ("qo_slots", "out_cache_loc", "entry of qo_indptr"),
    ("kv_range", "kv_indptr", "entry"),
    ("kv_slot", "kv_indices", "entry"),
    ("draft_slot", "out_cache_loc", "entry"),
    ("mask_width", "tree_mask", "request"),
    ("mask_indptr_order", "mask_indptr", "entry"),
    ("mask_range", "tree_mask", "request"),
    ("draft_count", "max_draft_len", "request"),
)
KIND_INDEX = {name: k for k, (name, _, _) in enumerate(FAULTS)}
NUM_FAULTS = len(FAULTS)
assert POSITIONS + NUM_FAULTS <= WORKSPACE and WORKSPACE + 1 + 2 * (NUM_FAULTS + 1) <= STATUS_SIZE


def new_status(device: torch.device | str | None = None) -> torch.Tensor:
    """A status tensor for `mla_tree_verify(..., status=)`: int32 zeros of STATUS_SIZE entries."""
    return torch.zeros(STATUS_SIZE, dtype=torch.int32, device=device)


def check_status_tensor(status) -> None:
    if not isinstance(status, torch.Tensor) or status.dtype != torch.int32 or status.dim() != 1 or status.numel() < STATUS_SIZE \
            or not status.is_contiguous():
        got = f"{status.dtype} shape {tuple(status.shape)}" if isinstance(status, torch.Tensor) else type(status).__name__
        raise ValueError(f"ddtree_op: argument 'status' must be a contiguous 1-D int32 tensor of {STATUS_SIZE} entries "
                         f"(ddtree_op.new_status()), got {got}")


def fault_message(kind: int, position: int, value: int) -> str:
    """The error of one fault, naming the argument (the message check_verify_inputs raises)."""
    name, argument, _ = FAULTS[kind]
    p, v = position, value
    text = {
        "qo_start": f"must start at 0, got qo_indptr[0] = {v}",
        "qo_order": f"must be non-decreasing, got qo_indptr[{p}] = {v} below the entry before it",
        "kv_order": f"must be non-decreasing, got kv_indptr[{p}] = {v} below the entry before it",
        "qo_rows": f"has fewer rows (T_pad) than qo_indptr[{p}] = {v} (T_pad >= qo_indptr[B] is required)",
        "qo_slots": f"has fewer entries than qo_indptr[{p}] = {v} (one draft slot per draft row is required)",
        "kv_range": f"must lie within [0, kv_indices.numel()], got kv_indptr[{p}] = {v}",
        "kv_slot": f"holds slot ids outside [0, S) (the rows of kv_cache): kv_indices[{p}] = {v}",
        "draft_slot": f"holds slot ids outside [0, S) (the rows of kv_cache): out_cache_loc[{p}] = {v}",
        "mask_width": f"has fewer bits per packed row than request {p} has drafts ({v})",
        "mask_indptr_order": f"must be non-decreasing, got mask_indptr[{p}] = {v} below the entry before it",
        "mask_range": f"has {v} entries but request {p}'s mask block reads past them (or starts before 0)",
        "draft_count": f"is exceeded: request {p} has {v} drafts",
    }[name]
    return f"ddtree_op: argument '{argument}' {text}"


def decode_status(status: torch.Tensor) -> list[tuple[str, str, int]]:
    """The faults a status records, lowest kind first: (kind, argument, first position). Reads the
    tensor on the host (a sync on CUDA)."""
    check_status_tensor(status)
    values = status[:WORKSPACE].tolist()
    return [(name, argument, values[POSITIONS + k]) for k, (name, argument, _) in enumerate(FAULTS) if values[BITS] >> k & 1]


def key_word(status: torch.Tensor) -> int:
    """The word where the status's keys start: the workspace's first 8-byte aligned word (the
    CUDA kernels' choice, from the data pointer; no device read)."""
    return WORKSPACE + (status.data_ptr() + 4 * WORKSPACE) % 8 // 4


def write_keys(status: torch.Tensor, present: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
    """The keys of the faults of kinds `present` (bool [NUM_FAULTS]) at their first `positions`
    with the raw `values` there (int64 [NUM_FAULTS], values saturated to int32), as the CUDA
    preparation leaves them for the launch that publishes (a tensor program: no host reads)."""
    word = key_word(status)
    keys = status[word:word + 2 * NUM_FAULTS].view(NUM_FAULTS, 2)  # (low, high) words of each key
    zero = torch.zeros_like(positions)
    keys[:, 0].copy_(torch.where(present, ~values.clamp(-(2**31), 2**31 - 1), zero).to(torch.int32))
    keys[:, 1].copy_(torch.where(present, ~positions, zero).to(torch.int32))


def publish(status: torch.Tensor) -> None:
    """status[:WORKSPACE] from the keys a preparation left (publish_status=False), then the keys
    and the ticket cleared: what one thread of the CUDA attention kernels does, as a tensor program
    (no host reads) for the paths that launch none (CPU, the reference backend, no rows)."""
    word = key_word(status)
    keys = status[word:word + 2 * NUM_FAULTS].view(NUM_FAULTS, 2)
    present = keys[:, 1] != 0
    positions = torch.where(present, ~keys[:, 1], -1)
    values = ~keys[:, 0]
    kinds = torch.arange(NUM_FAULTS, device=status.device)
    bits = (present.long() << kinds).sum()
    kind = torch.where(present, kinds, NUM_FAULTS).min()
    found = kind < NUM_FAULTS
    first = kind.clamp(max=NUM_FAULTS - 1)
    head = torch.stack([bits, torch.where(found, kind, -1), torch.where(found, positions[first], -1).long(),
                        torch.where(found, values[first], 0).long()])
    status[:POSITIONS].copy_(head.to(torch.int32))
    status[POSITIONS:POSITIONS + NUM_FAULTS].copy_(positions)
    status[word:word + 2 * (NUM_FAULTS + 1)].zero_()


def rename_arguments(message: str, names: dict[str, str] | None) -> str:
    """`message` with "argument 'x'" naming names[x] instead (for a wrapper whose own arguments
    are called otherwise, e.g. {"tree_mask": "custom_mask"})."""
    for inner, outer in (names or {}).items():
        message = message.replace(f"argument '{inner}'", f"argument '{outer}'")
    return message


def raise_on_status(status: torch.Tensor, names: dict[str, str] | None = None) -> None:
    """Raises the ValueError that `check_verify_inputs` (DDTREE_CHECK=1) raises for the first
    fault the status records; returns if the step was clean. Reads the tensor (a sync on CUDA):
    call it after the step, outside any captured graph. `names` renames the arguments in the
    message, for wrappers (see rename_arguments)."""
    check_status_tensor(status)
    values = status[:WORKSPACE].tolist()
    if values[BITS] == 0:
        return
    kind = values[KIND]
    if not 0 <= kind < NUM_FAULTS:
        raise ValueError(f"ddtree_op: argument 'status' holds an unknown fault kind {kind} (bits {values[BITS]:#x})")
    others = [FAULTS[k][0] for k in range(NUM_FAULTS) if values[BITS] >> k & 1 and k != kind]
    suffix = f" (also: {', '.join(others)})" if others else ""
    raise ValueError(rename_arguments(fault_message(kind, values[POSITION], values[VALUE]) + suffix, names))
