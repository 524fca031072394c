"""The environment variables that steer the op, each read once per process (on first use).

Reading os.environ on every call costs time on the op's hot path and lets a process change
behaviour mid-run; `reset()` forgets what was read (tests call it after changing the environment).
"""

from __future__ import annotations

import functools
import os
import warnings

CHECK_ENV = "DDTREE_CHECK"  # on (1/true/yes/on): check argument values eagerly (check_verify_inputs) on every eager call
DISABLE_SM90_ENV = "DDTREE_DISABLE_SM90"  # on: backend "auto" never picks the sm90 kernel


TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("", "0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def flag(name: str) -> bool:
    """A boolean variable: 1/true/yes/on (any case) is on, 0/false/no/off or unset is off; any
    other value is off with a warning (once: the value is read once per process)."""
    value = os.environ.get(name, "").strip().lower()
    if value in TRUE_VALUES:
        return True
    if value not in FALSE_VALUES:
        warnings.warn(f"ddtree_op: environment variable {name}={os.environ[name]!r} is not one of "
                      f"{'/'.join(TRUE_VALUES)} or {'/'.join(v for v in FALSE_VALUES if v)}; treated as off")
    return False


def reset() -> None:
    flag.cache_clear()
