"""The timeout unit every test deadline is expressed in.

Tests never sleep to synchronise; they wait on an event with a deadline such as ``5 * T``.
A slow machine (a loaded CI runner, coverage, ``PYTHONASYNCIODEBUG=1``) stretches every
deadline at once by exporting ``ASBP_TEST_TIMEOUT_UNIT`` instead of each test growing its
own magic number (the websockets test suite does the same).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Final

__all__ = ["ENV_VAR", "T", "timeout_unit"]

#: The environment variable holding the unit, in seconds.
ENV_VAR: Final = "ASBP_TEST_TIMEOUT_UNIT"

_DEFAULT_SECONDS: Final = 1.0


def timeout_unit(environ: Mapping[str, str]) -> float:
    """Read the timeout unit from ``environ``.

    Raises:
        ValueError: the variable is set but is not a positive, finite number of seconds.
            A typo must fail loudly rather than silently fall back to the default.
    """
    raw = environ.get(ENV_VAR, "").strip()
    if not raw:
        return _DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_VAR} must be a number of seconds, got {raw!r}") from exc
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{ENV_VAR} must be positive and finite, got {raw!r}")
    return value


#: The timeout unit in seconds, read once at import.
T: Final[float] = timeout_unit(os.environ)
