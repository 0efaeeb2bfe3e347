"""``Retry-After``: how long a broker that turned an attempt away asked to be left.

A broker answers ``503`` or ``429`` with ``Retry-After`` when it cannot take
the attempt now: a WebSocket handshake or an HTTP Channel open past its bound
on handshakes in flight (fault 2115, ``BROKER_BUSY``), an address opening HTTP
Channels faster than its rate (2108), a publisher its destinations cannot keep
up with (2109). Dialling again before then only adds to the load that made it
refuse, so the SDK waits *at least* that long before the next attempt, with its
usual backoff delay (full jitter, :class:`~agents.backoff.Backoff`) on top:
a fleet turned away in the same second does not come back as one wave at the
second the header named.

The value is RFC 9110 §10.2.3's: whole seconds, or an HTTP date. It is capped
at :data:`MAX_RETRY_AFTER`, so that a wrong header (or a clock far off) cannot
park an agent for hours; a value that is neither form is ignored.

The browser's WebSocket API cannot see a refused handshake's status or headers,
so the TypeScript client honours ``Retry-After`` on its HTTP long-poll
transport only (docs/user-agents.md).
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable, Mapping
from typing import Final

from agents.errors import BrokerBusy

__all__ = [
    "MAX_RETRY_AFTER",
    "RETRY_STATUSES",
    "parse_retry_after",
    "retry_after_in",
    "retry_after_of",
    "wait_before",
]

#: The longest a ``Retry-After`` makes the SDK wait (seconds).
MAX_RETRY_AFTER: Final = 60.0
#: The HTTP statuses whose ``Retry-After`` the SDK honours.
RETRY_STATUSES: Final = frozenset({429, 503})


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from ``value`` (delay-seconds or an HTTP date), at most
    :data:`MAX_RETRY_AFTER`; None when there is none or it is neither form.

    Args:
        value: the header's value.
        now: the wall clock, for an HTTP date (injectable for tests).
    """
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive parse means "-0000"
        return None
    seconds = when.timestamp() - now()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def retry_after_in(headers: Mapping[str, str], status: int) -> float | None:
    """The ``Retry-After`` of a response with ``status``, if it is one the SDK honours."""
    if status not in RETRY_STATUSES:
        return None
    return parse_retry_after(headers.get("retry-after"))


def retry_after_of(error: BaseException | None) -> float | None:
    """The ``Retry-After`` ``error`` (or what caused it) carries, if any."""
    seen = 0
    while error is not None and seen < 8:  # a cause chain is short; never loop for ever
        if isinstance(error, BrokerBusy):
            return error.retry_after
        error = error.__cause__
        seen += 1
    return None


def wait_before(retry_after: float | None, delay: float) -> float:
    """The wait before the next attempt: ``delay`` (the backoff's, jittered), on top
    of ``retry_after`` when the broker said one."""
    return delay if retry_after is None else retry_after + delay
