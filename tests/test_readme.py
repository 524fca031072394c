"""The README keeps up with the code: every environment variable the package reads is in its table."""

import re
from pathlib import Path

import ddtree_op
from ddtree_op import build

REPO = Path(__file__).resolve().parents[1]


def variables_read_by(paths):
    # Every DDTREE_* name as a string literal: read directly or through a constant/helper.
    return {name for path in paths for name in re.findall(r"""["'](DDTREE_[A-Z0-9_]+)["']""", path.read_text())}


def variables_read_by_cuda_sources(root):
    # The CUDA libraries read theirs with getenv (macros such as -DDDTREE_WAIT_CLOCKS are nvcc flags, not variables).
    return {name for path in root.rglob("*") if path.suffix in (".cu", ".cuh", ".cpp", ".h", ".hpp")
            for name in re.findall(r"""getenv\(\s*"(DDTREE_[A-Z0-9_]+)"\s*\)""", path.read_text())}


def test_every_environment_variable_is_in_the_readme_table():
    package = Path(ddtree_op.__file__).parent  # the imported copy, installed or in the checkout
    read = variables_read_by(list(package.rglob("*.py")) + [REPO / "setup.py"])
    read |= variables_read_by_cuda_sources(build.kernel_source_dir())
    assert {"DDTREE_CHECK", "DDTREE_CUDA_ARCH", "DDTREE_FORCE_JIT", "DDTREE_AOT_BUILD"} <= read
    table = set(re.findall(r"^\| `(DDTREE_\w+)` \|", (REPO / "README.md").read_text(), flags=re.M))
    assert read <= table, f"not in the README's table: {sorted(read - table)}"
    assert table <= read, f"in the README's table but read nowhere: {sorted(table - read)}"
