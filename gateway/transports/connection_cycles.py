"""Breaking the reference cycles a closed connection would leave for the collector.

Why this exists
---------------
An object in a reference cycle is not freed when its last outside reference goes:
it waits for a garbage collection, and a full collection walks every object the
process holds (with 10,000 Channels open, about half a second each). The soak
(bench/soak.py, issue 16) found the broker spending about 43% of its CPU per
WebSocket connect in full collections, because every closed connection left
cycles in the servers' connection layer (none in the broker's Channels). Each
module that owns a piece of a connection breaks its own cycles when the
connection ends (gateway/transports/coalescing.py, hypercorn_ws.py); this one
holds what they share, so that a closed connection is freed by reference
counting alone (tests/gateway/transports/test_connection_cycles.py counts it).

CPython 3.11's socket transport keeps a bound method of itself
(``_read_ready_cb``) for as long as it lives: transport, socket, buffers and
all are a cycle. CPython 3.12 drops it in ``close()`` (gh-100348, "Release
_SelectorSocketTransport._read_ready_cb on close() to free up cyclic
reference"); :func:`release_read_callback` does the same here, once the
connection is lost, when nothing reads from the transport again.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["release_read_callback"]

#: The attribute of CPython 3.11's ``_SelectorSocketTransport`` holding its own bound
#: ``_read_ready__*`` method (gh-100348; None from 3.12 on once closed).
_READ_CALLBACK: Final = "_read_ready_cb"


def release_read_callback(transport: asyncio.BaseTransport | None) -> None:
    """Drop a lost socket transport's bound read callback (its cycle with itself).

    Call it only once the connection is lost (from ``connection_lost`` or after),
    when the transport is closed and its socket is no longer watched for reading:
    the callback is never called again. Other transports (TLS, uvloop, 3.12's) are
    left alone.
    """
    if transport is not None and getattr(transport, _READ_CALLBACK, None) is not None:
        setattr(transport, _READ_CALLBACK, None)
