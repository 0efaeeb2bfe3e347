"""How a User-Agent comes back after its broker goes away, and what it tells its caller.

A :class:`~agents.user_agent.UserAgent` whose Channel ends without ``close()``
(the broker restarted, crashed or dropped it; a long-poll Channel the broker
no longer knows) dials again, with exponential backoff and full jitter
(:class:`~agents.backoff.Backoff`) so that every client of a restarted broker
does not come back at the same instant. The caller sees each step as a
:class:`ChannelEvent`:

``LOST``
    the Channel ended. A Command awaiting its answer keeps waiting if the
    Channel can be resumed (a WebSocket Channel: its answer is replayed when
    it is), and fails with :class:`~agents.errors.ChannelLost` otherwise, or
    when a new Channel replaces it: it may or may not have been acted on, and
    only the caller knows whether sending it again is safe.
``RECONNECTING``
    attempt ``attempt`` (0-based) starts after ``delay`` seconds; ``error`` is
    why the previous attempt failed (None for the first).
``RECONNECTED``
    a Channel is open again. A WebSocket Channel is *resumed* when a broker of
    the bus can (``channel_id`` equals ``previous``; docs/protocol.md,
    "Resuming a Channel"): every Command routed to it while away arrives
    next, in order and once, through ``receive``; ``kept`` says what else
    follows a Channel at that broker, as it said: ``groups`` (its group
    memberships), ``subjects`` (its signed-in Subjects, same ``s``, still
    authenticated) and ``subscriptions`` (its topic and queue subscriptions),
    and ``subjects`` the ``s`` of each that followed it: sign in again only the
    Subjects not in it, and subscribe again only when ``subscriptions`` is not
    in ``kept``. When no broker can resume it (its log expired,
    resume is off) it is a new Channel (``channel_id`` differs from
    ``previous``) and whatever the old one held is gone. ``UserAgent._reopen``
    is where the choice is made.
``GAVE_UP``
    ``max_attempts`` attempts failed in a row: the UserAgent is closed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from agents.backoff import Backoff
from asbp import ChannelId

__all__ = ["DEFAULT_BACKOFF", "DEFAULT_RECONNECT", "ChannelEvent", "ChannelEventKind", "Reconnect"]

#: The first retry within 0.1 s, none more than 10 s apart, with full jitter.
DEFAULT_BACKOFF: Final = Backoff(initial=0.1, maximum=10.0)


class ChannelEventKind(enum.Enum):
    """What happened to a User-Agent's Channel (see the module docstring)."""

    #: The Channel ended without ``close()``; awaited answers failed.
    LOST = "lost"
    #: An attempt to open a Channel again is about to start.
    RECONNECTING = "reconnecting"
    #: A Channel is open again.
    RECONNECTED = "reconnected"
    #: Every attempt allowed failed: the UserAgent is closed for good.
    GAVE_UP = "gave_up"


@dataclass(frozen=True, slots=True)
class ChannelEvent:
    """One step of losing a Channel and getting one back."""

    kind: ChannelEventKind
    #: The Channel open now (RECONNECTED), else the one lost.
    channel_id: ChannelId | None
    #: RECONNECTED: the Channel that was lost.
    previous: ChannelId | None = None
    #: RECONNECTING and GAVE_UP: attempts that failed in a row so far.
    attempt: int = 0
    #: RECONNECTING: seconds waited before this attempt.
    delay: float = 0.0
    #: Why the Channel ended (LOST) or the last attempt failed.
    error: BaseException | None = None
    #: RECONNECTED: what followed a resumed Channel (``groups``, ``subjects``);
    #: empty for a new Channel, or a broker that keeps neither.
    kept: frozenset[str] = frozenset()
    #: RECONNECTED: the ``s`` of the Subjects that followed it, still signed in
    #: (any other it had ended while it was away: sign that one in again).
    subjects: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Reconnect:
    """A User-Agent's reconnection settings.

    Args:
        backoff: the delay before each attempt (full jitter by default).
        max_attempts: attempts in a row before giving up; None: never give up.

    Raises:
        ValueError: ``max_attempts`` below 1.
    """

    backoff: Backoff = DEFAULT_BACKOFF
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (or None: for ever)")


#: Reconnect for ever, with :data:`DEFAULT_BACKOFF`.
DEFAULT_RECONNECT: Final = Reconnect()
