"""The environment variables that steer the op, each read once per process (on first use).

Reading os.environ on every call costs time on the op's hot path and lets a process change
behaviour mid-run; `reset()` forgets what was read (tests call it after changing the environment).
"""

from __future__ import annotations

import functools
import os

CHECK_ENV = "DDTREE_CHECK"  # "1": check argument values eagerly (check_verify_inputs) on every eager call
DISABLE_SM90_ENV = "DDTREE_DISABLE_SM90"  # "1": backend "auto" never picks the sm90 kernel


@functools.lru_cache(maxsize=None)
def flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


def reset() -> None:
    flag.cache_clear()
