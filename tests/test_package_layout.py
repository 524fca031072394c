"""The import rules of docs/design.md (Package layout), checked on the sources: no backend imports
another, backends never import the layers above them, and the leaves import nothing."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "ddtree_op"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """ddtree_op modules that `path` imports (anywhere in the file, relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m == "ddtree_op" or m.startswith("ddtree_op.")}


MODULES = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}
BACKENDS = ("ddtree_op.backends.reference", "ddtree_op.backends.triton", "ddtree_op.backends.sm90")
ABOVE_BACKENDS = ("ddtree_op.api", "ddtree_op.ops", "ddtree_op.checks", "ddtree_op.prep", "ddtree_op.meta",
                  "ddtree_op.paged", "ddtree_op.sglang", "ddtree_op.integrations")


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("leaf", ["ddtree_op.contract", "ddtree_op.environment"])
def test_leaves_import_no_ddtree_module(leaf):
    assert MODULES[leaf] == set()


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "ddtree_op.backends")))
def test_backends_import_no_other_backend_and_nothing_above(module):
    imported = MODULES[module]
    assert not [m for m in imported if any(within(m, above) for above in ABOVE_BACKENDS)], imported
    if module == "ddtree_op.backends":
        return  # the registry imports every backend
    own = [b for b in BACKENDS if within(module, b)]
    others = [b for b in BACKENDS if b not in own]
    assert not [m for m in imported if any(within(m, b) for b in others)], imported


def test_nothing_imports_the_integrations():
    for module, imported in MODULES.items():
        if not (within(module, "ddtree_op.sglang") or within(module, "ddtree_op.integrations")):
            assert not [m for m in imported if within(m, "ddtree_op.sglang") or within(m, "ddtree_op.integrations")], module
