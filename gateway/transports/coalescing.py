"""Uvicorn's WebSocket protocol, writing what one loop turn sends in one system call.

ASGI sends one WebSocket message per ``send`` call, and Uvicorn writes each to
its socket at once: a queue delivery of a hundred notifications costs a hundred
``send(2)`` calls, and on loopback or a busy host each of them may also wake the
reader and give it the CPU. That was the largest single cost of the queue path
(bench/queues.py): more than the broker's own Python per message.

:class:`CoalescingWebSocketProtocol` keeps Uvicorn's ``websockets-sansio``
protocol as it is and hands it a transport that gathers writes: the first
write of a loop turn schedules a flush (``call_soon``), and every write until
then joins it, so the frames leave together, in order, in one system call,
before the loop next waits for I/O. Nothing else changes: ASGI still gets one
``send`` per message, every message is framed by Uvicorn, and closing or
aborting the transport writes what was gathered first (close) or drops it with
the connection (abort), as the real transport would.

Backpressure is unchanged: the real transport still calls the protocol's
``pause_writing`` when its buffer fills, and what is gathered is bounded by what
the application sends in one loop turn (each Channel's outbox bounds that).

Enabled with ``uvicorn.Config(ws=CoalescingWebSocketProtocol)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["CoalescingTransport", "CoalescingWebSocketProtocol"]


class CoalescingTransport(asyncio.Transport):
    """A transport that writes what it was given in one loop turn as one write.

    Args:
        transport: the real transport; everything but writing goes to it.
        loop: the loop the flush is scheduled on.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._gathered: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        gathered = self._gathered
        if not gathered:
            self._loop.call_soon(self.flush)
        gathered.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what was gathered now (the scheduled flush, or before a close)."""
        gathered = self._gathered
        if gathered:
            self._gathered = []
            if not self._transport.is_closing():
                self._transport.write(gathered[0] if len(gathered) == 1 else b"".join(gathered))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._gathered = []
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._gathered))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class CoalescingWebSocketProtocol(WebSocketsSansIOProtocol):
    """Uvicorn's ``websockets-sansio`` protocol on a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(CoalescingTransport(transport, self.loop))
