"""Finding the ``u`` of a frame the codec refused, so its fault can carry it.

Every receiver of frames answers one the codec refuses with an ``asbp.fault``
carrying the frame's ``u`` when it can be found: the broker
(``gateway.routing.intake``, ``gateway.transports.http``) and the SDK's
Broker-Agent (``agents.broker_agent``), which must give bad input the same
faults as the broker. So the search lives here, in the protocol core, pure.
"""

from __future__ import annotations

from typing import Final

from asbp.grammar import MAX_COMMAND_ID

__all__ = ["SNIFF_WINDOW", "sniff_command_id"]

#: How far a refused frame is searched for its ``u``.
SNIFF_WINDOW: Final = 1024
_COMMA, _SEMICOLON, _QUOTE, _OPEN, _CLOSE, _EQUALS = b",;'[]="


def sniff_command_id(frame: bytes) -> int | None:
    """Best-effort ``u`` of a frame the codec refused, so its fault can carry it.

    Only the first 1 KiB is searched: a frame is refused before this is
    called, and a fault must not cost more than the frame did.

    The codec cannot hand the ``u`` over itself: a header marked UTF-8 is
    decoded whole before any pair is read, so ``+u=5,c=x\xff;`` fails before
    its ``u`` is seen. So the bytes are walked here with the header grammar's
    lexical rules only (quotes, lists, ``,`` between pairs, ``;`` ending the
    header), which hold whatever else is wrong with the frame: ``u=<digits>``
    counts where a key starts (after the UTF-8 marker or a ``,`` between pairs)
    and never inside a quoted token, a list or the body.
    """
    window = frame[:SNIFF_WINDOW]
    end = len(window)
    position = 1 if window[:1] == b"+" else 0
    while position < end:
        found = _u_at(window, position)
        if found is not None:
            return found if found <= MAX_COMMAND_ID else None
        position = _next_key(window, position)
    return None


def _u_at(window: bytes, position: int) -> int | None:
    """The value of ``u=<digits>`` standing at ``position``, ended by ``,`` or ``;``."""
    if not window.startswith(b"u=", position):
        return None
    start = digit = position + 2
    while digit < len(window) and 0x30 <= window[digit] <= 0x39:
        digit += 1
    digits = window[start:digit]
    if digit == len(window) or window[digit] not in (_COMMA, _SEMICOLON):
        return None
    if not digits or len(digits) > 5 or (len(digits) > 1 and digits[0] == 0x30):
        return None
    return int(digits)


def _next_key(window: bytes, position: int) -> int:
    """Where the next pair's key starts after ``position``, or the window's end.

    A quote opens a quoted token only where a token starts (after ``=``, ``[``
    or a ``,`` in a list); elsewhere it is a reserved character out of place,
    which the codec has refused already, and is passed over like any other.
    """
    end = len(window)
    in_list = False
    previous = -1
    while position < end:
        byte = window[position]
        opens_token = previous in (_EQUALS, _OPEN) or (in_list and previous == _COMMA)
        if byte == _QUOTE and opens_token:
            closing = window.find(b"'", position + 1)
            if closing < 0:
                return end
            position, previous = closing + 1, _QUOTE
            continue
        if byte == _SEMICOLON:
            return end
        if in_list:
            in_list = byte != _CLOSE
        elif byte == _OPEN and previous == _EQUALS:
            in_list = True
        elif byte == _COMMA:
            return position + 1
        position, previous = position + 1, byte
    return end
