"""Answers in several parts (§1.3.4.2 ``t`` and ``o``): progress and reassembly.

A Respondent with a large answer sends it as several Commands carrying the
request's ``u``: ``t`` (the total) only on the first, and ``o`` (the part's
one-based place) on each. ``UserAgent.stream`` already yields the parts in
``o`` order; this module adds what a User-Agent showing progress or
reassembling the answer needs:

* :func:`ordered_parts` wraps such a stream and yields a :class:`StreamPart`
  per part (``position`` of ``total``, for a progress bar), after checking the
  sequence is consistent: ``t`` on the first part, never a different ``t``
  later, ``o`` = 1, 2, ... ``t`` without gaps, and exactly ``t`` parts;
* :func:`reassemble` does the same for parts collected in arrival order.

Our reading of the draft, as in ``docs/protocol.md``: a plain answer with
neither key is a stream of one; ``t`` without ``o`` is the first part; a
later part that repeats the same ``t`` is tolerated (the draft says ``t``
"should only be included with the first"), a different one is an error; and
``t=0`` cannot be answered, since no part could carry it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass

from agents.errors import AgentError
from asbp import Command

__all__ = ["StreamError", "StreamPart", "ordered_parts", "reassemble"]


class StreamError(AgentError):
    """The parts of an answer do not form one consistent ``t``/``o`` sequence."""


@dataclass(frozen=True, slots=True)
class StreamPart:
    """One part of an answer, with its place in the whole."""

    command: Command
    #: ``o``: this part's one-based place.
    position: int
    #: ``t``: how many parts there are, from the first part.
    total: int

    @property
    def progress(self) -> float:
        """The fraction of the answer received with this part, 0 < progress <= 1."""
        return self.position / self.total

    @property
    def last(self) -> bool:
        """Whether this part completes the answer."""
        return self.position == self.total


class _Sequence:
    """The rules of one stream, checked part by part in ``o`` order."""

    __slots__ = ("expected", "total")

    def __init__(self) -> None:
        self.total: int | None = None
        self.expected = 1

    def check(self, command: Command) -> StreamPart:
        total, position = command.total, command.of_total
        if self.total is None:
            if total is None and position is None:
                total = 1  # a plain answer: a stream of one
            if total is None:
                raise StreamError(f"the first part (o={position}) does not carry t")
            if total < 1:
                raise StreamError(f"t={total}: a stream needs at least one part")
            self.total = total
        elif total is not None and total != self.total:
            raise StreamError(f"part {position} says t={total}; the first said t={self.total}")
        if position is None and self.expected == 1:
            position = 1  # t without o: the first part
        if position is None or position != self.expected:
            raise StreamError(f"expected part {self.expected}, got o={position}")
        if position > self.total:
            raise StreamError(f"part {position} of a {self.total}-part stream")
        self.expected += 1
        return StreamPart(command, position, self.total)

    def finish(self) -> None:
        if self.total is None:
            raise StreamError("the stream had no parts")
        if self.expected <= self.total:
            raise StreamError(f"the stream ended after {self.expected - 1} of {self.total} parts")


async def ordered_parts(commands: AsyncIterable[Command]) -> AsyncIterator[StreamPart]:
    """Yield each part of an in-order stream (``UserAgent.stream``) with its place.

    ::

        async for part in ordered_parts(ua.stream("analytics.query", query)):
            show(part.progress)
            ...

    Raises:
        StreamError: the parts are inconsistent (see the module docstring),
            or the stream ends early.
        Whatever ``commands`` raises (``FaultError`` for a fault part...).
    """
    sequence = _Sequence()
    async for command in commands:
        part = sequence.check(command)
        yield part
        if part.last:
            return
    sequence.finish()


def reassemble(commands: Iterable[Command]) -> list[StreamPart]:
    """Put the parts of one answer, collected in any order, in ``o`` order, and check them.

    Raises:
        StreamError: a part is missing, repeated or inconsistent.
    """

    def place(command: Command) -> int:
        position = command.of_total
        return 1 if position is None else position

    ordered = sorted(commands, key=place)
    sequence = _Sequence()
    parts = [sequence.check(command) for command in ordered]
    sequence.finish()
    return parts
