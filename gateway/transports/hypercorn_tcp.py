"""Hypercorn's connection, freed by reference counting once it ends.

Hypercorn's asyncio ``TCPServer`` (one per connection) hands its protocol a bound
method of itself (``protocol_send``) and keeps the protocol: a reference cycle
through the connection's protocol, task group, streams, transport and socket,
about 40 objects per connection that only a garbage collection frees. With many
Channels open a full collection walks all of them (gateway/transports/
connection_cycles.py says why that matters). :class:`AsbpTCPServer` lets go of
the protocol once its connection is done, and of the socket transport's read
callback (CPython 3.11's own cycle). It changes nothing while the connection
lives.

:func:`gateway.transports.hypercorn_ws.install` puts it where Hypercorn's worker
looks ``TCPServer`` up for each connection (``hypercorn.asyncio.run``), beside
the WebSocket stream, and for the same Hypercorn versions.

Upstream: clearing ``self.protocol`` at the end of ``TCPServer.run`` is a small
fix worth offering to Hypercorn.
"""

from __future__ import annotations

from hypercorn.asyncio.tcp_server import TCPServer

from gateway.transports.connection_cycles import release_read_callback

__all__ = ["AsbpTCPServer"]


class AsbpTCPServer(TCPServer):
    """Hypercorn's ``TCPServer``, leaving no reference cycle when its connection ends."""

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            # ``run`` returns once its task group (every task of the connection) is
            # done and the writer closed: nothing sends through the protocol again.
            self.__dict__.pop("protocol", None)
            release_read_callback(self.writer.transport)
