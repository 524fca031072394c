"""ddtree_op: tree-masked MLA attention for the verify step of tree speculative decoding."""

from ._version import __version__
from . import ops  # registers torch.ops.ddtree.*
from .api import PreparedVerify, mla_tree_verify, mla_tree_verify_prepared, prepare_tree_verify
from .checks import check_verify_inputs
from .paged import check_paged_inputs, mla_tree_verify_paged, prepare_tree_verify_paged
from .prep import MASK_LAYOUTS
from .status import decode_status, new_status, raise_on_status

__all__ = ["__version__", "mla_tree_verify", "mla_tree_verify_paged", "prepare_tree_verify", "prepare_tree_verify_paged",
           "mla_tree_verify_prepared", "PreparedVerify", "check_paged_inputs", "check_verify_inputs", "MASK_LAYOUTS", "ops", "new_status", "raise_on_status", "decode_status"]
