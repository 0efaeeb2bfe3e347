"""Message ids: random (version 4) UUIDs, 32 hex digits each, from a pool of random bits.

One id is drawn per publication, so it is on the hot path: ``uuid.uuid4().hex``
makes a UUID object nobody needs and asks the kernel for 16 bytes each time.
A :class:`MessageIdPool` asks ``os.urandom`` for a few kilobytes at once (where
``uuid4`` takes its bits too) and cuts ids from their hex digits.

The pool belongs to its owner (one per :class:`~gateway.messaging.Messaging`),
not to the module: two brokers in one process draw from their own bits, and a
test can make its own. Nothing observable depends on who drew which bits; what
matters is that no two processes share them, so a forked child forgets the
bits it inherited (``os.register_at_fork``).
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Final

__all__ = ["MessageIdPool"]

#: Random bytes asked of the kernel at once: 128 ids.
_RANDOM_BYTES: Final = 4096
#: A hex digit with its top two bits set to the variant's 10 (RFC 4122).
_VARIANT: Final = {f"{d:x}": f"{8 | (d & 3):x}" for d in range(16)}


class MessageIdPool:
    """Random hex digits, cut 32 at a time into version 4 UUIDs."""

    __slots__ = ("__weakref__", "_at", "_hex")

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0
        # A weak reference: the fork hook cannot be unregistered, and must not keep
        # a stopped broker's pool alive. A pool gone by then has nothing to forget.
        os.register_at_fork(after_in_child=functools.partial(_forget, weakref.ref(self)))

    def next(self) -> str:
        """A new message id: what ``uuid.uuid4().hex`` returns, for a fraction of its cost."""
        at = self._at
        if at >= len(self._hex):
            self._hex, at = os.urandom(_RANDOM_BYTES).hex(), 0
        self._at = at + 32
        digits = self._hex[at : at + 32]
        # The version nibble is 4; the variant's two top bits are 10 (RFC 4122).
        return f"{digits[:12]}4{digits[13:16]}{_VARIANT[digits[16]]}{digits[17:]}"

    def forget(self) -> None:
        """Drop the bits drawn so far: the next id starts from fresh ones."""
        self._hex, self._at = "", 0


def _forget(pool: weakref.ref[MessageIdPool]) -> None:
    """A forked child draws its own bits: two processes must never share ids."""
    alive = pool()
    if alive is not None:
        alive.forget()
