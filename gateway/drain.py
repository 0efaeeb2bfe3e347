"""Draining a broker that stops on a bus: a rolling restart or a scale-down loses nothing.

Theory of operation
-------------------
A broker alone on its bus has nowhere to send its clients, so it stops as it
always did (gateway.broker, ``Broker.stop``). A broker on a bus of several
first hands its work to the others, in four steps, bounded in all by
``drain_timeout`` (docs/kubernetes.md, "Rolling updates"):

1. *Out of the directory for new work.* Every Command-Name its Tubes serve is
   withdrawn from the plane (``not_serving``), so other brokers stop
   forwarding requests here, and the router sends its own Channels' new
   Commands to the bus instead of to its Tubes (``Router.draining``). Its Tubes
   stay open: what was forwarded here before the withdrawal landed is still
   served.
2. *Commands in flight to its Respondents finish.* It waits until its Tubes
   owe no answer (or the drain time is up: what is left then gets 2102 when the
   Tubes close, as it always did).
3. *Channels leave.* Each WebSocket Channel that can resume is handed over
   (``HeldOutbox.hand_over``): what is queued for it is written, then the
   socket is closed with 1012 ("Service Restart") and the reason ``2114 Broker
   restarting: resume elsewhere``; frames routed to it meanwhile go to its log
   only. The connection keeps being read until the client's own close frame
   arrives, so every Command the client sent before it heard the close is
   routed (to the bus: step 1), and only then is the log released, at once, for
   another broker to hold. Answers that arrive after that go into the log
   (gateway.plane.redis: the log or its new holder takes them), so the client
   gets them when it resumes. A Channel that cannot resume is closed with the
   same code; its client opens a new one.
4. *Tubes leave*, with 1012 and the same reason, once what they owed is
   answered: their agents reconnect (an ``ApplicationAgent`` following the
   brokers by DNS stops asking this one when it is gone).

*Fencing* (:func:`fence`) is step 3 alone, for a broker the bus took for dead
while it ran: its loop stalled past the lease (a long pause, a starved CPU),
the other brokers swept its entries, and frames routed to its Channels went
straight into their logs, which its open connections never read. When its
next renewal finds its lease gone (gateway.plane.redis, ``_renew``), before it
takes the lease back, every WebSocket Channel is told to resume as in a drain
(1012, 2114), so its client gets those frames from the log, in order. The
broker stays on the bus and its Tubes stay: forwards to it were refused or
faulted (2102) while it was counted dead, so nothing they owe is lost.

What this module never does is sleep for a fixed time: each wait ends as soon
as its condition holds, checked every :data:`_CHECK` seconds (a broker
stopping is not a hot path; the conditions are counters, cheap to read).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from asbp import FaultCode
from gateway.connections.channels import ChannelKind
from gateway.connections.resume import HeldOutbox

if TYPE_CHECKING:
    from gateway.broker import Broker

__all__ = ["Drained", "drain", "fence"]

#: Seconds between looks at a drain's condition.
_CHECK: Final = 0.02
#: What the Channels' clients get, at least, to send their closing frame back,
#: even when the Respondents took the whole drain time.
_CLOSE_GRACE: Final = 1.0


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drain did, for the ``broker.drained`` log record."""

    #: WebSocket Channels told to resume elsewhere (their logs released).
    handed_over: int
    #: WebSocket Channels that could not resume, closed with the same code.
    closed: int
    #: Answers still owed by this broker's Tubes when they closed (these get 2102).
    stranded: int
    #: Seconds the drain took.
    seconds: float


def _owed(broker: Broker) -> int:
    return sum(tube.in_flight for tube in broker.respondents.tubes() if not tube.closed)


def _websockets_open(broker: Broker) -> int:
    return sum(1 for channel in broker.channels if channel.kind is ChannelKind.WEBSOCKET)


async def _until(holds: Callable[[], bool], deadline: float) -> bool:
    """Whether ``holds()`` came true before ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    while not holds():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_CHECK)
    return True


async def drain(broker: Broker) -> Drained:
    """Hand this broker's work to the rest of its bus; see the module docstring."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + broker.config.drain_timeout
    router = broker.router
    plane = broker.plane
    # 1. No new work: the names leave the directory, new Commands go to the bus.
    router.draining = True
    for name in broker.respondents.names():
        plane.not_serving(name)
    # 2. What the Respondents here owe is answered.
    await _until(lambda: _owed(broker) == 0, deadline)
    # 3. The Channels leave, each log released once its client stopped sending.
    # Looked at again on every check: a client may still open or resume a Channel
    # here until the listening socket closes (the Service stopped sending new
    # connections here already; a client that knows this broker's address may not).
    leaving = _Leaving(broker)
    await _until(
        lambda: leaving.all_told() and _websockets_open(broker) == 0,
        max(deadline, loop.time() + _CLOSE_GRACE),
    )
    # What those last Commands asked of the Tubes here (forwarded before the
    # withdrawal landed) is answered too, within what is left of the time.
    await _until(lambda: _owed(broker) == 0, deadline)
    # 4. The Tubes leave; their agents reconnect to the other brokers.
    stranded = _owed(broker)
    for tube in broker.respondents.tubes():
        if tube.fault is None:
            tube.fault = FaultCode.BROKER_RESTARTING
        router.close_tube(tube)
    return Drained(leaving.handed_over, leaving.closed, stranded, round(loop.time() - started, 3))


def fence(broker: Broker) -> None:
    """The bus took this running broker for dead: its WebSocket Channels resume,
    from their logs (see the module docstring)."""
    leaving = _Leaving(broker)
    leaving.all_told()
    broker.log.warning(
        "broker.fenced", extra={"handed_over": leaving.handed_over, "closed": leaving.closed}
    )


class _Leaving:
    """Tells each WebSocket Channel of the broker to leave, once."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.handed_over = 0
        self.closed = 0

    def all_told(self) -> bool:
        """Tell the Channels not told yet; True (the condition of a wait goes on)."""
        broker = self._broker
        for channel in list(broker.channels):
            if channel.kind is not ChannelKind.WEBSOCKET or channel.closed:
                continue
            if channel.fault is FaultCode.BROKER_RESTARTING:
                continue  # told already: its client's close frame is on its way
            outbox = channel.outbox
            if isinstance(outbox, HeldOutbox) and outbox.logging:
                channel.fault = FaultCode.BROKER_RESTARTING
                outbox.hand_over()
                self.handed_over += 1
            else:
                broker.close_channel(channel, FaultCode.BROKER_RESTARTING)
                self.closed += 1
        return True
