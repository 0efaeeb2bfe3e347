"""Uvicorn's HTTP/1.1 protocol, answering a request body cut short by end-of-file.

Uvicorn's ``H11Protocol.eof_received`` does nothing, so asyncio closes the
transport the moment a client half-closes: a client that sends a short body
(fewer bytes than its ``Content-Length``, or chunks that never end) and then
shuts down its sending side gets no status at all, where Hypercorn answers
``400``. This subclass answers ``400`` with fault 1201 instead, written before
the transport closes, and tells the application its client is gone so that
nothing else is written.

It is used per server, ``uvicorn.Config(http=EofAnsweringH11Protocol)``; Uvicorn
itself is not patched. Only a request whose body is still arriving is answered:
an end-of-file between requests, or after the response began, closes as before.
A closed connection leaves no reference cycle of its transport
(:meth:`EofAnsweringH11Protocol.connection_lost`).
"""

from __future__ import annotations

from typing import Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

import asbp
from asbp import FaultCode
from asbp.fault_commands import fault_command
from gateway.transports.connection_cycles import release_read_callback

__all__ = ["EofAnsweringH11Protocol"]

_FAULT: Final = asbp.encode(
    fault_command(FaultCode.INVALID_MESSAGE_FORMAT, "the request body ended early")
)


class EofAnsweringH11Protocol(H11Protocol):
    """``H11Protocol`` that answers ``400`` and a fault to a body ended by end-of-file."""

    def connection_lost(self, exc: Exception | None) -> None:
        # Also an HTTP connection's end: CPython 3.11's transport cycle, broken
        # (gateway/transports/connection_cycles.py), so reference counting frees it.
        try:
            super().connection_lost(exc)
        finally:
            release_read_callback(self.transport)

    def eof_received(self) -> None:
        cycle = self.cycle
        if (
            cycle is None
            or self.conn.their_state is not h11.SEND_BODY
            or self.conn.our_state is not h11.SEND_RESPONSE
            or cycle.response_started
        ):
            return  # asyncio closes the transport, as Uvicorn does
        headers = [
            (b"content-type", b"application/asbp"),
            (b"content-length", b"%d" % len(_FAULT)),
            (b"connection", b"close"),
            *self.server_state.default_headers,
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
        self.transport.write(self.conn.send(h11.Data(data=_FAULT)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        # The application's receive() now reports a disconnect and its send() is
        # dropped: the answer above is the only one.
        cycle.disconnected = True
        cycle.message_event.set()
