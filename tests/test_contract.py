"""The CUDA side's constants (cutlass_kernels/contract.cuh) agree with ddtree_op/contract.py."""

import ast
import re
from pathlib import Path

from ddtree_op import contract

HEADER = Path(__file__).parents[1] / "cutlass_kernels" / "contract.cuh"

# Header name -> the value it must have on the Python side.
EXPECTED = {
    "kLatentDim": contract.LATENT_DIM,
    "kRopeDim": contract.ROPE_DIM,
    "kQkDim": contract.QK_DIM,
    "kRowsPerBlock": contract.ROWS_PER_BLOCK,
    "kKeyTile": contract.KEY_TILE,
    "kUnitKeys": contract.UNIT_KEYS,
    "kSm90MaxSplits": contract.SM90_MAX_SPLITS,
    "kCutCostUnits": contract.CUT_COST_UNITS,
    "kLaneSharesMaxBatch": contract.LANE_SHARES_MAX_BATCH,
    "kLaneSharesMinUse": contract.LANE_SHARES_MIN_USE,
    "kPartialSlotsPerCta": contract.PARTIAL_SLOTS_PER_CTA,
    "kPlanHeader": contract.PLAN_HEADER,
    "kPlanFields": contract.PLAN_FIELDS,
    "kPieceFields": contract.PIECE_FIELDS,
    "kMaxPieceBudget": contract.MAX_PIECE_BUDGET,
    "kPieceSlotsPerSplit": contract.PIECE_SLOTS_PER_SPLIT,
    "kLongestFirstMaxBatch": contract.LONGEST_FIRST_MAX_BATCH,
    "kPlanEqualShares": contract.PLAN_EQUAL_SHARES,
    "kPlanRowBlocks": contract.PLAN_ROW_BLOCKS,
    "kPlanItems": contract.PLAN_ITEMS,
    "kPlanUsed": contract.PLAN_USED,
    "kPlanHeads": contract.PLAN_HEADS,
    "kPlanCtas": contract.PLAN_CTAS,
    "kPlanSplits": contract.PLAN_SPLITS,
    "kPlanPieces": contract.PLAN_PIECES,
    "kPlanRequest": contract.PLAN_REQUEST,
    "kPlanBlock": contract.PLAN_BLOCK,
    "kPlanUnits": contract.PLAN_UNITS,
    "kPlanFirstItem": contract.PLAN_FIRST_ITEM,
    "kPieceRow": contract.PIECE_ROW,
    "kPieceUnits": contract.PIECE_UNITS,
    "kPieceSlot": contract.PIECE_SLOT,
    "kMaskWordBits": contract.MASK_WORD_BITS,
    "kMaxPackedMaskBits": max(contract.PACKED_MASK_BITS.values()),
}


def _evaluate(expression: str, known: dict[str, int]) -> int:
    """An integer expression of literals, earlier constants, +, - and *."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return known[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            left, right = value(node.left), value(node.right)
            return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}[type(node.op)]
        raise ValueError(f"contract.cuh: unsupported expression {expression!r}")

    return value(ast.parse(expression, mode="eval").body)


def header_constants() -> tuple[dict[str, int], list[str]]:
    text = re.sub(r"//[^\n]*", "", HEADER.read_text())
    ints: dict[str, int] = {}
    for name, expression in re.findall(r"constexpr\s+(?:int|int64_t)\s+(\w+)\s*=\s*([^;]+);", text):
        ints[name] = _evaluate(expression.strip(), ints)
    layouts = re.search(r"kMaskLayouts\[\]\s*=\s*\{([^}]*)\}", text)
    return ints, re.findall(r'"(\w+)"', layouts.group(1)) if layouts else []


def test_cuda_constants_agree_with_contract_py():
    ints, layouts = header_constants()
    assert ints == EXPECTED  # also: every header constant is one the Python side knows
    assert tuple(layouts) == contract.MASK_LAYOUTS
