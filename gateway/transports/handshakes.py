"""A bound on the handshakes a broker serves at once: past it, a fast 503.

Theory of operation
-------------------
A broker past its capacity used to take every handshake it was offered and
serve each in turn. Open loop at 1,000 connects a second on a broker that
could do 800, the handshakes waiting grew without end, every one was served
after its client had given up (10 s), and the broker spent its whole core on
Channels nobody would use: 2 to 143 connects a second in time instead of 800
(bench/README.md, "soak.py"). Serving fewer in time beats serving all too late.

:class:`HandshakeBound` counts the WebSocket handshakes being served: from
the moment the server has parsed the upgrade request (before the application
runs, before any Channel is made) until the application accepts or refuses it,
or the connection ends. Past ``channels.max_handshakes`` of them, a new one is
answered at once by the server's protocol with ``503 Service Unavailable``,
``Retry-After`` and fault 2115 in the body, and closed: no ASGI task, no
Channel, no greeting, no close handshake. Under overload the count rises where
the broker falls behind: a loop turn that parses more requests than the
application will get to soon. HTTP POSTs that would open a Channel consult the
same bound (gateway/transports/http.py): while WebSocket handshakes pile up,
an HTTP Channel is not opened either.

A handshake whose client has already gone is not served at all: under
overload a connection may wait in the kernel's accept queue longer than its
client waits for it, and serving it (a Channel, a greeting, a close) would be
work for nobody. When the server has parsed the upgrade request, one
``getsockopt(TCP_INFO)`` (a microsecond or two, Linux) tells whether the
client's FIN (the socket is in ``CLOSE_WAIT``) or reset has arrived; if so the
connection is closed with no answer (:func:`peer_gone`, counted as
``abandoned``). A client that half-closes before its handshake is answered
cannot use a WebSocket anyway.

The listening socket's backlog (the connections the kernel accepts before the
broker takes them) is ``channels.max_handshakes`` too (gateway/ops/server.py):
past both, a client's SYN waits in the kernel for its own retry instead of
joining a queue the broker would serve too late.

The bound lives in the lifespan state (``scope["state"]``, under
:data:`STATE_KEY`), which both servers hand to their protocols, so the
server-side code that refuses (gateway/transports/coalescing.py on Uvicorn,
gateway/transports/hypercorn_ws.py on Hypercorn) needs nothing else of the
broker. ``/metrics`` reports the refusals (``asbp_busy_handshakes``).
"""

from __future__ import annotations

import socket
from typing import Any, Final

from asbp import FaultCode, encode
from asbp.fault_commands import fault_command

__all__ = ["RETRY_AFTER", "STATE_KEY", "HandshakeBound", "busy_body", "busy_message", "peer_gone"]

#: Where the bound is kept in the lifespan state.
STATE_KEY: Final = "handshakes"

#: Seconds a refused client is told to wait (``Retry-After``). A handshake takes
#: about a millisecond of the broker's CPU: one second drains a full bound many
#: times over, and a client that spreads its retry over it (the SDKs' jitter)
#: does not come back as one wave.
RETRY_AFTER: Final = 1


#: ``tcp_info.tcpi_state`` of an open connection (Linux ``TCP_ESTABLISHED``). Before the
#: server has written or closed anything, any other state means the client is gone: its
#: FIN came (``CLOSE_WAIT``) or its reset (``CLOSE``).
_ESTABLISHED: Final = 1


def peer_gone(transport: Any) -> bool:
    """Whether the client of ``transport`` has closed its side already (its FIN came).

    False where that cannot be known (no TCP socket, no ``TCP_INFO``): the
    handshake is then served as before.
    """
    sock = transport.get_extra_info("socket")
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None:
        return False
    try:
        info: bytes = sock.getsockopt(socket.IPPROTO_TCP, option, 1)
    except OSError:  # not TCP (a Unix socket)
        return False
    return bool(info) and info[0] != _ESTABLISHED


def busy_message(limit: int) -> str:
    """What fault 2115 says, past a bound of ``limit``."""
    return f"the broker is serving {limit} handshakes already; retry after {RETRY_AFTER} s"


def busy_body(limit: int) -> bytes:
    """The body of the 503: an ``asbp.fault`` with code 2115, as an HTTP POST would get."""
    return encode(fault_command(FaultCode.BROKER_BUSY, busy_message(limit)))


class HandshakeBound:
    """How many handshakes are being served, and the refusals past ``limit``.

    Args:
        limit: handshakes served at once at most; 0 turns the bound off.
    """

    __slots__ = ("_body", "abandoned", "in_flight", "limit", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Handshakes admitted and not yet done.
        self.in_flight = 0
        #: Handshakes refused so far (the ``asbp_busy_handshakes`` counter).
        self.refused = 0
        #: Handshakes not served because their client had gone (:func:`peer_gone`).
        self.abandoned = 0
        self._body = busy_body(limit)

    @property
    def body(self) -> bytes:
        """The refusal's body (made once: refusing must cost next to nothing)."""
        return self._body

    def enter(self) -> bool:
        """Admit one more handshake (True), or count a refusal (False): the caller
        answers 503 and must not call :meth:`leave`."""
        if self.limit > 0 and self.in_flight >= self.limit:
            self.refused += 1
            return False
        self.in_flight += 1
        return True

    def turns_away(self) -> bool:
        """Whether a Channel that opens without a handshake to wait for (an HTTP POST)
        must be refused now: True (and counted) while the bound is full."""
        if self.limit > 0 and self.in_flight >= self.limit:
            self.refused += 1
            return True
        return False

    def leave(self) -> None:
        """One admitted handshake is done (accepted, refused by the application, or
        its connection lost); call once per :meth:`enter` that returned True."""
        self.in_flight -= 1
