"""Forwarding by splicing: the broker's header pairs written into the sender's bytes.

The router forwards a Command with a few pairs changed: ``i`` and ``b`` added
(User-Agent to Respondent), or ``a`` set and ``d`` removed (Application-Agent
to User-Agents). Rebuilding the Command and encoding it again costs ten times
what splicing the pairs into the frame it arrived in does, so when the frame is
at hand and the splice is provably the same (tests/gateway/routing/test_splice.py
checks it against rebuilding), the :class:`Splicer` splices; otherwise it
rebuilds. Either way the result is exactly what encoding the changed Command
gives, within the same header limit.
"""

from __future__ import annotations

from typing import Final

import asbp
from asbp import Command
from asbp.grammar import is_bare

__all__ = ["Splicer", "without_pair"]

#: Identities whose ``,a=`` pair is kept; identities are configured, so few.
_MAX_AGENT_PAIRS: Final = 4096


def without_pair(header: bytes, key: bytes) -> bytes | None:
    """``header`` (which holds no quotes) without the pair for ``key``."""
    if header.startswith(key + b"="):
        start = 0
    else:
        start = header.find(b"," + key + b"=")
        if start == -1:
            return None
    value = header.find(b"=", start) + 1
    if header[value : value + 1] == b"[":
        stop = header.find(b"]", value) + 1
    else:
        stop = header.find(b",", value)
        if stop == -1:
            stop = len(header)
    if start == 0:
        return header[stop + 1 :]  # and the comma after it, if any
    return header[:start] + header[stop:]


class Splicer:
    """The frames the router forwards, spliced when safe and rebuilt otherwise.

    Args:
        broker_id: this broker's Broker-Identifier, the value of ``b``.
        limits: the codec limits every forwarded frame must stay within.
    """

    __slots__ = ("_agent_pairs", "_broker_id", "_broker_pair", "_limits", "_splice_size")

    def __init__(self, broker_id: str, limits: asbp.Limits) -> None:
        self._broker_id = broker_id
        self._limits = limits
        #: ",b=<broker>", and how many bytes a splice adds to a header.
        self._broker_pair = b",b=" + broker_id.encode("ascii")
        self._splice_size = len(b",i=") + 32 + len(self._broker_pair)
        self._agent_pairs: dict[str, bytes | None] = {}

    def from_channel(self, channel_id: str, command: Command, frame: bytes | None) -> bytes:
        """The frame a Respondent gets: ``i`` and ``b`` added, any ``a`` removed.

        When the User-Agent's frame holds none of ``a``, ``i`` and ``b``, the
        two pairs are spliced in before its terminator: the broker minted both
        values, they are bare tokens, and decoding the result gives exactly
        ``command.with_keys(i=…, b=…)``, at a tenth of the cost of building
        and encoding that Command. Otherwise, or when the header would pass
        its limit, the Command is rebuilt.

        Raises:
            ProtocolError: the header has no room for the additions.
        """
        if frame is not None and "a" not in command and "i" not in command and "b" not in command:
            end = len(frame) - len(command.body) - 1
            if end + self._splice_size <= self._limits.max_header_bytes:
                return b"".join(
                    (
                        frame[:end],
                        b",i=",
                        channel_id.encode("ascii"),
                        self._broker_pair,
                        frame[end:],
                    )
                )
        outbound = command.with_keys(i=channel_id, b=self._broker_id)
        if "a" in outbound:
            outbound = outbound.without_keys("a")
        return asbp.encode(outbound, limits=self._limits)

    def to_user_agents(self, agent_id: str, command: Command, frame: bytes | None) -> bytes:
        """The frame User-Agents get: ``d`` removed, ``a`` set to the verified agent.

        Like :meth:`from_channel`, a splice when it is safe: the header holds no
        quotes (so every ``,d=`` is a real pair), no ``a``, and no UTF-8 marker,
        and the identity is a bare token. Otherwise the Command is rebuilt.

        Raises:
            ProtocolError: the header has no room for ``a``.
        """
        if frame is not None and "a" not in command:
            end = len(frame) - len(command.body) - 1
            pair = self._agent_pair(agent_id)
            header: bytes | None = frame[:end]
            if pair is not None and frame.find(b"'", 0, end) == -1 and frame[0] != 0x2B:  # "+"
                if "d" in command:
                    header = without_pair(frame[:end], b"d")
                if header is not None and len(header) + len(pair) <= self._limits.max_header_bytes:
                    return b"".join((header, pair if header else pair[1:], frame[end:]))
        # Add before removing: a Command of only "d" must not be left keyless.
        outbound = command.with_keys(a=agent_id)
        if "d" in outbound:
            outbound = outbound.without_keys("d")
        return asbp.encode(outbound, limits=self._limits)

    def _agent_pair(self, agent_id: str) -> bytes | None:
        """``,a=<agent_id>`` when the identity is a bare token, else None."""
        pair = self._agent_pairs.get(agent_id)
        if pair is None and agent_id not in self._agent_pairs:
            # ASCII too: the header it joins may lack the "+" UTF-8 marker.
            pair = b",a=" + agent_id.encode() if is_bare(agent_id) and agent_id.isascii() else None
            if len(self._agent_pairs) < _MAX_AGENT_PAIRS:
                self._agent_pairs[agent_id] = pair
        return pair
