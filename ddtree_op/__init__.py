"""ddtree_op: tree-masked MLA attention for the verify step of tree speculative decoding."""

from . import ops  # registers torch.ops.ddtree.*
from .api import mla_tree_verify
from .checks import check_verify_inputs
from .prep import MASK_LAYOUTS

__all__ = ["mla_tree_verify", "check_verify_inputs", "MASK_LAYOUTS", "ops"]
