"""Virtual-queue names and topic-pattern matching, shared by every engine.

A virtual queue (Sapo-Broker 3, "Message Publication and Subscription",
"Virtual Queues") is named ``[private name]@[topic name subscription pattern]``,
for example ``myVirtualQueue@/topic/.*``: a queue fed by every topic message
whose name *fully* matches the pattern. The private name comes first and
cannot contain ``@``, so a full name splits at its first ``@``; the pattern
may contain ``@``.

Patterns go through :func:`gateway.acl.compile_destination`, the same
checker ACL entries use: a pattern is run against every topic name published,
so one that can backtrack without bound is refused when declared, never
discovered under load. A refused name raises :class:`InvalidVirtualQueue`,
which is a ``ValueError`` and carries fault 2001 ("Invalid destination name",
Sapo's example being "VIRTUAL_QUEUE without '@' in name").

:class:`TopicMatcher` answers "which virtual queues does this topic feed?" on
every publication: exact names (a pattern without regex syntax) by one dict
lookup, the rest by a scan of their compiled regexes, with the answer cached
per topic name until the set of patterns changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from asbp import FaultCode
from gateway.acl import PatternError, compile_destination
from gateway.errors import GatewayError

__all__ = [
    "VIRTUAL_QUEUE_SEPARATOR",
    "InvalidVirtualQueue",
    "TopicMatcher",
    "VirtualQueue",
    "parse_virtual_queue",
    "virtual_queue",
]

#: Separates a virtual queue's private name from its topic pattern.
VIRTUAL_QUEUE_SEPARATOR: Final = "@"

# Characters that make a pattern more than its literal text. Without them (and
# "(" rules out inline flags such as (?x)), a pattern matches one name only.
_REGEX_SYNTAX: Final = frozenset(".^$*+?{}[]\\|()")


# Also a ValueError: virtual_queue() and parse_virtual_queue() validate arguments,
# and their callers may catch a bad one that way.
class InvalidVirtualQueue(GatewayError, ValueError):
    """A virtual-queue name or pattern is refused (fault 2001).

    Attributes:
        name: the private name as given.
        pattern: the pattern as given.
    """

    code = FaultCode.INVALID_DESTINATION_NAME

    def __init__(self, message: str, *, name: str, pattern: str) -> None:
        super().__init__(message)
        self.name = name
        self.pattern = pattern


@dataclass(frozen=True, slots=True)
class VirtualQueue:
    """A validated virtual queue: build it with :func:`virtual_queue`."""

    #: The private name (no ``@``).
    name: str
    #: The topic-name pattern, as declared.
    pattern: str
    #: ``pattern`` compiled by :func:`gateway.acl.compile_destination`.
    regex: re.Pattern[str] = field(compare=False, repr=False)

    @property
    def full_name(self) -> str:
        """``name@pattern``: the queue name consumers fetch from."""
        return f"{self.name}{VIRTUAL_QUEUE_SEPARATOR}{self.pattern}"

    def feeds_on(self, topic: str) -> bool:
        """Whether a message published to ``topic`` is copied into this queue."""
        return self.regex.fullmatch(topic) is not None


def virtual_queue(name: str, pattern: str) -> VirtualQueue:
    """Validate a private name and a topic pattern.

    Raises:
        InvalidVirtualQueue: the name is empty or contains ``@``; the pattern is
            empty, not a regular expression, or unsafe (see
            :mod:`gateway.acl.patterns` for the shapes refused and why).
    """
    if not name:
        raise InvalidVirtualQueue(
            "a virtual queue needs a private name before '@'", name=name, pattern=pattern
        )
    if VIRTUAL_QUEUE_SEPARATOR in name:
        raise InvalidVirtualQueue(
            f"a virtual queue's private name must not contain '@': {name!r}",
            name=name,
            pattern=pattern,
        )
    try:
        regex = compile_destination(pattern)
    except PatternError as exc:
        raise InvalidVirtualQueue(
            f"invalid virtual queue pattern {pattern!r}: {exc}", name=name, pattern=pattern
        ) from exc
    return VirtualQueue(name, pattern, regex)


def parse_virtual_queue(full_name: str) -> VirtualQueue:
    """Split ``name@pattern`` at its first ``@`` and validate both parts.

    Raises:
        InvalidVirtualQueue: there is no ``@``, or :func:`virtual_queue` refuses a part.
    """
    name, separator, pattern = full_name.partition(VIRTUAL_QUEUE_SEPARATOR)
    if not separator:
        raise InvalidVirtualQueue(
            f"a virtual queue is named 'name@pattern', got {full_name!r}",
            name=full_name,
            pattern="",
        )
    return virtual_queue(name, pattern)


class TopicMatcher:
    """Which keys' patterns fully match a topic name.

    Keys are opaque to the matcher (engines use virtual queues' full names).
    :meth:`match` costs one dict lookup for a topic name seen before; for a new
    one, a dict lookup for the exact-name patterns plus one ``fullmatch`` per
    regex pattern, each linear in the name thanks to ``compile_destination``.
    The cache holds at most ``cache_size`` names and starts over when full, so
    a flood of distinct names costs what an uncached scan would, no more.

    Args:
        cache_size: topic names whose answers are remembered.
    """

    __slots__ = ("_cache", "_cache_size", "_exact", "_keys", "_regexes")

    def __init__(self, *, cache_size: int = 4096) -> None:
        self._cache_size = cache_size
        self._keys: dict[str, VirtualQueue] = {}
        self._exact: dict[str, list[str]] = {}
        self._regexes: dict[str, re.Pattern[str]] = {}
        self._cache: dict[str, tuple[str, ...]] = {}

    def add(self, key: str, queue: VirtualQueue) -> None:
        """Feed ``key`` from now on with topics matching ``queue``'s pattern (idempotent)."""
        if key in self._keys:
            return
        self._keys[key] = queue
        if _REGEX_SYNTAX.isdisjoint(queue.pattern):
            self._exact.setdefault(queue.pattern, []).append(key)
        else:
            self._regexes[key] = queue.regex
        self._cache.clear()

    def discard(self, key: str) -> None:
        """Stop feeding ``key``; nothing happens if it is unknown."""
        queue = self._keys.pop(key, None)
        if queue is None:
            return
        if key in self._regexes:
            del self._regexes[key]
        else:
            keys = self._exact[queue.pattern]
            keys.remove(key)
            if not keys:
                del self._exact[queue.pattern]
        self._cache.clear()

    def match(self, topic: str) -> tuple[str, ...]:
        """The keys whose pattern fully matches ``topic``."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        found = list(self._exact.get(topic, ()))
        found.extend(key for key, regex in self._regexes.items() if regex.fullmatch(topic))
        result = tuple(found)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[topic] = result
        return result

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
