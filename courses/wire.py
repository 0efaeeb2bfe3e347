"""What crosses a Course: the Conversation Protocol profile's keys and Commands (pure).

A Command addressed by ``r`` crosses as itself, with two keys of ours added
(docs/courses.md, "On the wire"):

``course.id``
    The crossing's id, unique per sending bus (32 random hex digits); the
    receiving bus acknowledges it and drops a second copy within its window.
``course.via``
    The domains the Command has left, oldest first. Its length is the hop count;
    a bus that finds its own domain there refuses the Command (a loop, 2208).

and the receiving bus answers each with ``c=asbp.course.ack,course.id=…``.
``p`` is always the sending bus's stamp (the sender's verified address), ``x``
travels untouched, ``r`` holds only the recipients of the receiving domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from asbp import Command, Limits, encode

__all__ = [
    "ACK",
    "BATCH",
    "BROKER_KEYS",
    "DELIVERED",
    "HELLO",
    "ID_KEY",
    "MAX_BATCH_BYTES",
    "VIA_KEY",
    "ack_frame",
    "crossing_from",
    "domain_of",
    "pack",
    "recipients_of",
    "split_by_domain",
    "unpack",
    "via_of",
    "with_subject",
]

#: The answering bus's signed answer, the first frame on a Course.
HELLO: Final = "asbp.course"
#: The acknowledgement of one crossing.
ACK: Final = "asbp.course.ack"
#: Several crossings in one WebSocket message: the body holds each encoded crossing
#: as ``<length in decimal>:<frame>``, one after the other (see :func:`pack`).
BATCH: Final = "asbp.course.batch"
#: A batch's body stays under this, well inside the receiver's frame limit (256 KiB).
MAX_BATCH_BYTES: Final = 192 * 1024
#: The notice a sender who asked (``notice=delivered``) gets once the peer accepted it.
DELIVERED: Final = "delivered"
#: The crossing's id.
ID_KEY: Final = "course.id"
#: The domains crossed so far.
VIA_KEY: Final = "course.via"
#: Keys a User-Agent may not write: the broker's alone.
BROKER_KEYS: Final = (ID_KEY, VIA_KEY)


_ACK_PREFIX: Final = f"c={ACK},{ID_KEY}=".encode("ascii")
#: Ids as a sending bus makes them (courses.service), joined by commas.
_OUR_IDS: Final = re.compile(r"[0-9a-f]{32}(?:,[0-9a-f]{32})*")


def ack_frame(ids: list[str]) -> bytes:
    """The encoded ``c=asbp.course.ack,course.id=[…]`` for ``ids``: written straight
    when every id is 32 hex digits (bare tokens, as a sending bus of ours makes
    them), else encoded (an id another implementation chose may need quoting)."""
    joined = ",".join(ids)
    if _OUR_IDS.fullmatch(joined):
        return b"%b[%b];" % (_ACK_PREFIX, joined.encode("ascii"))
    return encode(Command({"c": ACK, ID_KEY: ids}))


def pack(frames: list[bytes], *, max_bytes: int = MAX_BATCH_BYTES) -> list[bytes]:
    """The WebSocket messages that carry ``frames``, in order: a lone frame as itself,
    several as ``asbp.course.batch`` Commands of at most ``max_bytes`` of body each.

    One message per crossing costs a message's framing, a system call and the
    receiving server's per-message work each; a backlog drains in batches.
    """
    messages: list[bytes] = []
    group: list[bytes] = []
    size = 0

    def flush() -> None:
        if len(group) == 1:
            messages.append(group[0][group[0].index(b":") + 1 :])
        elif group:
            messages.append(b"c=" + BATCH.encode() + b";" + b"".join(group))
        group.clear()

    for frame in frames:
        item = b"%d:%b" % (len(frame), frame)
        if group and size + len(item) > max_bytes:
            flush()
            size = 0
        group.append(item)
        size += len(item)
    flush()
    return messages


def unpack(body: bytes) -> list[bytes]:
    """The frames of an ``asbp.course.batch`` body.

    Raises:
        ValueError: the body is not a sequence of ``<length>:<frame>``.
    """
    frames: list[bytes] = []
    position = 0
    while position < len(body):
        colon = body.find(b":", position, position + 8)
        digits = body[position:colon]
        if colon < 0 or not digits.isdigit():
            raise ValueError(f"no length at byte {position}")
        length = int(digits)
        start = colon + 1
        if start + length > len(body):
            raise ValueError(f"a frame of {length} bytes runs past the body at byte {start}")
        frames.append(body[start : start + length])
        position = start + length
    return frames


_VIA_PAIR: Final = f",{VIA_KEY}=[".encode("ascii")
#: ``course.id``'s pair right after ``course.via``'s list closes.
_ID_PAIR: Final = f"],{ID_KEY}=".encode("ascii")
#: Keys a crossing must not carry for :func:`with_subject` to splice: this bus's own.
_SPLICE_REFUSES: Final = frozenset(("s", "i", "a", "b", "d", "g"))


def with_subject(
    frame: bytes, command: Command, subject_id: str, *, max_header_bytes: int
) -> bytes | None:
    """The frame a recipient gets, made from the crossing's own bytes: ``course.id``
    and ``course.via`` removed and ``s`` added, or None when that is not provably
    the same as encoding ``command`` (the crossing decoded) without them and with
    ``s``, and the caller must encode.

    Splicing saves decoding's counterpart, an encode per recipient (as
    gateway/routing/splice.py does within a bus). It is safe when the header holds
    no quotes (so every ``,course.id=`` found is a real pair), no UTF-8 marker,
    and none of this bus's keys (which the Command would lose): ``s`` is 32 hex
    digits, a bare token, and goes last, where ``with_keys`` puts it.
    """
    end = len(frame) - len(command.body) - 1
    if (
        end <= 0
        or frame[0] == 0x2B  # "+": a UTF-8 header
        or frame.find(b"'", 0, end) != -1
        or not _SPLICE_REFUSES.isdisjoint(command.header)
        or not (subject_id.isascii() and subject_id.isalnum())
    ):
        return None
    header = frame[:end]
    # The sending bus puts ``course.via`` then ``course.id`` last (crossing_from,
    # and ``with_keys`` when it encodes): cut them off at once when they are the
    # tail, each pair once (keys are unique), else take each pair out.
    tail = header.rfind(_VIA_PAIR)
    if (
        tail > 0
        and header.find(b"]", tail) == (at := header.find(_ID_PAIR, tail))
        and at > 0
        and header.find(b",", at + len(_ID_PAIR)) == -1
        and ID_KEY in command
    ):
        header = header[:tail]
    else:
        for key in (ID_KEY, VIA_KEY):
            if key in command:
                header = _without_pair(header, key.encode("ascii"))
        if not header:
            return None
    spliced = b"".join((header, b",s=", subject_id.encode("ascii"), frame[end:]))
    # ",s=" and 32 hex digits: within the limit encoding would enforce.
    return spliced if len(header) + 35 <= max_header_bytes else None


#: Keys a User-Agent's Command must not carry for :func:`crossing_from` to splice:
#: those the sending bus removes (but ``s``) or stamps.
_CROSSING_REFUSES: Final = frozenset(("i", "a", "b", "d", "g", "p", ID_KEY, VIA_KEY))
#: A character no bare token holds (asbp/grammar.py): outside printable ASCII
#: (0x21-0x7E), or reserved.
_NOT_BARE: Final = re.compile(r"[^!-~]|[;=,'\[\]+]")


def crossing_from(
    frame: bytes,
    command: Command,
    publisher: str,
    via: list[str],
    crossing_id: str,
    *,
    limits: Limits,
) -> bytes | None:
    """The crossing made from the bytes a User-Agent's Command arrived in: its ``s``
    removed, ``p``, ``course.via`` and ``course.id`` added; or None when that is not
    provably the same as encoding ``command`` (``frame`` decoded) without ``s``
    and with those keys, and the caller must encode.

    Splicing saves the sending bus two copies of the Command and an encode per
    crossing, as :func:`with_subject` does at the receiving one. It is safe when
    the header holds no quotes (so every ``,s=`` found is a real pair), no UTF-8
    marker, none of the keys the bus removes or stamps but ``s``, and every value
    added is a bare token; the limits the encoder would enforce are checked.
    """
    header_keys = command.header
    end = len(frame) - len(command.body) - 1
    if (
        end <= 0
        or frame[0] == 0x2B  # "+": a UTF-8 header
        or frame.find(b"'", 0, end) != -1
        or not _CROSSING_REFUSES.isdisjoint(header_keys)
        or len(header_keys) + 3 - ("s" in header_keys) > limits.max_keys
        or len(via) > limits.max_list_items
    ):
        return None
    joined = ",".join(via)
    # Every value added is a bare token: one search over them all, since a
    # character that is not bare is found in the concatenation if in any of them
    # (the commas that join ``via`` are ours, not searched).
    if _NOT_BARE.search(f"{publisher}{crossing_id}{''.join(via)}") is not None:
        return None
    header = frame[:end]
    if "s" in header_keys:
        header = _without_pair(header, b"s")
        if not header:
            return None
    header += f",p={publisher},{VIA_KEY}=[{joined}],{ID_KEY}={crossing_id}".encode("ascii")
    if len(header) > limits.max_header_bytes or len(header) + len(frame) - end > (
        limits.max_frame_bytes
    ):
        return None
    return header + frame[end:]


def _without_pair(header: bytes, key: bytes) -> bytes:
    """``header`` (which holds no quotes and has the pair) without the pair for ``key``."""
    start = 0 if header.startswith(key + b"=") else header.find(b"," + key + b"=")
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


def domain_of(address: str) -> str:
    """The domain of a Conversation-Address ``local*domain``, lower case."""
    return address.rpartition("*")[2].lower()


def split_by_domain(recipients: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Recipients grouped by domain, each once, in the order first named."""
    if isinstance(recipients, tuple) and len(recipients) == 1:
        # One recipient (most Commands): no grouping to do.
        return {domain_of(recipients[0]): recipients}
    groups: dict[str, dict[str, None]] = {}
    for address in recipients:
        groups.setdefault(domain_of(address), {})[address] = None
    return {domain: tuple(addresses) for domain, addresses in groups.items()}


def recipients_of(command: Command) -> tuple[str, ...]:
    """``r`` as written (``Command.recipients`` without a conversion per address)."""
    value = command.get("r")
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def via_of(command: Command) -> tuple[str, ...]:
    """The domains ``command`` has crossed from (``course.via``)."""
    value = command.get(VIA_KEY)
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
