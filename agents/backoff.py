"""Reconnect delays: exponential backoff with full jitter.

A fleet of agents that lost the same broker must not all dial back at the
same instant. With *full jitter* each delay is drawn uniformly from zero up
to the exponential ceiling (AWS Architecture Blog, "Exponential Backoff And
Jitter", 2015), which spreads reconnects best for the least total wait.

``Backoff`` is a pure value: it computes delays and never sleeps, so the
retry loops that use it stay testable without a clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Backoff", "Jitter"]

#: ``"full"``: uniform in [0, ceiling]. ``"none"``: the ceiling itself.
Jitter = Literal["full", "none"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before reconnect attempt number ``attempt``.

    The ceiling for attempt ``n`` (counting from 0) is
    ``min(maximum, initial * multiplier ** n)``.

    Args:
        initial: seconds; the ceiling of the first delay.
        maximum: seconds; no delay is ever longer.
        multiplier: how much the ceiling grows per failed attempt.
        jitter: ``"full"`` (the default) or ``"none"``.

    Raises:
        ValueError: a non-positive or non-finite value, a maximum below the
            initial delay, or a multiplier below 1.
    """

    initial: float = 0.1
    maximum: float = 10.0
    multiplier: float = 2.0
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        for field_name in ("initial", "maximum", "multiplier"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{field_name} must be positive and finite, got {value!r}")
        if self.maximum < self.initial:
            raise ValueError("maximum must not be below initial")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")
        if self.jitter not in ("full", "none"):
            raise ValueError(f"jitter must be 'full' or 'none', got {self.jitter!r}")

    def ceiling(self, attempt: int) -> float:
        """The longest delay attempt ``attempt`` (0-based) may wait."""
        if attempt < 0:
            raise ValueError("attempt must not be negative")
        # Computed in log space: multiplier ** attempt overflows a float long
        # before an agent gives up retrying.
        limit = math.log(self.maximum / self.initial)
        growth = attempt * math.log(self.multiplier)
        if growth >= limit:
            return self.maximum
        return self.initial * math.exp(growth)

    def delay(self, attempt: int, *, uniform: Callable[[], float] = random.random) -> float:
        """The delay before attempt ``attempt`` (0-based).

        Args:
            attempt: how many attempts have failed in a row before this one.
            uniform: returns a float in [0, 1); injectable for tests.
        """
        ceiling = self.ceiling(attempt)
        if self.jitter == "none":
            return ceiling
        return ceiling * uniform()
