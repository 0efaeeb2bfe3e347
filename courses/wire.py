"""What crosses a Course: the Conversation Protocol profile's keys and Commands (pure).

A Command addressed by ``r`` crosses as itself, with two keys of ours added
(docs/courses.md, "On the wire"):

``course.id``
    The crossing's id, unique per sending bus (``<domain>:<random>``); the
    receiving bus acknowledges it and drops a second copy within its window.
``course.via``
    The domains the Command has left, oldest first. Its length is the hop count;
    a bus that finds its own domain there refuses the Command (a loop, 2208).

and the receiving bus answers each with ``c=asbp.course.ack,course.id=…``.
``p`` is always the sending bus's stamp (the sender's verified address), ``x``
travels untouched, ``r`` holds only the recipients of the receiving domain.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from asbp import Command

__all__ = [
    "ACK",
    "BROKER_KEYS",
    "DELIVERED",
    "HELLO",
    "ID_KEY",
    "VIA_KEY",
    "domain_of",
    "split_by_domain",
    "via_of",
]

#: The answering bus's signed answer, the first frame on a Course.
HELLO: Final = "asbp.course"
#: The acknowledgement of one crossing.
ACK: Final = "asbp.course.ack"
#: The notice a sender who asked (``notice=delivered``) gets once the peer accepted it.
DELIVERED: Final = "delivered"
#: The crossing's id.
ID_KEY: Final = "course.id"
#: The domains crossed so far.
VIA_KEY: Final = "course.via"
#: Keys a User-Agent may not write: the broker's alone.
BROKER_KEYS: Final = (ID_KEY, VIA_KEY)


def domain_of(address: str) -> str:
    """The domain of a Conversation-Address ``local*domain``, lower case."""
    return address.rpartition("*")[2].lower()


def split_by_domain(recipients: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Recipients grouped by domain, each once, in the order first named."""
    groups: dict[str, dict[str, None]] = {}
    for address in recipients:
        groups.setdefault(domain_of(address), {})[address] = None
    return {domain: tuple(addresses) for domain, addresses in groups.items()}


def via_of(command: Command) -> tuple[str, ...]:
    """The domains ``command`` has crossed from (``course.via``)."""
    value = command.get(VIA_KEY)
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
