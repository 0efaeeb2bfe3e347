"""Opening the Channel of a ``/asbp`` WebSocket: a new one, or one resumed.

Kept apart from gateway.transports.websocket, whose endpoint calls
:func:`open_channel` once per connection: a new Channel is greeted with
``asbp.channel`` (and, when resume is on, its log starts right after the
greeting, which carries the secret and so is never logged); a connection to
``/asbp?resume=<i>`` is not greeted, its first frame must be ``asbp.resume``
(gateway.connections.resume does the rest).

``/asbp?count=2`` declares that the client does not count queue deliveries for a
resume (docs/protocol.md, "Resuming a Channel"): the Channel's log then leaves
them out. Without it (every client from before the parameter) the log and the
count take in every frame, as they always did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from asbp import Command, FaultCode
from asbp.names import CHANNEL
from gateway.connections.channels import UNCOUNTED_DELIVERIES, Channel
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.resume import QUERY, ChannelResume, Refused
from gateway.transports.asgi import Receive, Scope, Send, remote_address

if TYPE_CHECKING:
    from gateway.broker import Broker

__all__ = ["CLOSE_REFUSED", "COUNT", "open_channel"]

#: WebSocket close code after a refused resume (policy violation), with the fault.
CLOSE_REFUSED: Final = 1008
#: The query parameter of ``/asbp`` saying how the client counts frames for a resume.
COUNT: Final = "count"
#: Its values: 1 every frame after the greeting (what a client that says nothing
#: does), 2 all but queue deliveries.
_COUNTS: Final = {"1": 1, str(UNCOUNTED_DELIVERIES): UNCOUNTED_DELIVERIES}


def _query(scope: Scope) -> dict[str, list[str]]:
    query = scope.get("query_string") or b""
    return parse_qs(query.decode("latin-1"), keep_blank_values=True)


def _count(query: dict[str, list[str]]) -> int:
    """The client's ``count``; Refused when it says something this broker does not know."""
    values = query.get(COUNT)
    if values is None:
        return 1
    count = _COUNTS.get(values[-1]) if len(values) == 1 else None
    if count is None:
        raise Refused(
            FaultCode.INVALID_HEADER_VALUE,
            f"{COUNT} of /asbp is 1 (every frame counted) or 2 (all but queue"
            f" deliveries), once, not {', '.join(map(repr, values))}",
        )
    return count


def _is_text(frame: bytes) -> bool:
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def open_channel(
    scope: Scope, receive: Receive, send: Send, broker: Broker, address_key: str | None
) -> tuple[Channel, StreamOutbox] | None:
    """The connection's Channel and outbox, greeted or resumed; None: closed, nothing to serve."""
    resume: ChannelResume | None = scope["state"].get("resume")
    router = broker.router
    query = _query(scope)
    if QUERY in query:
        # How it counts is in its record: it counts as when it opened.
        return await _resume(scope, receive, send, broker, resume, address_key)
    try:
        count = _count(query)
    except Refused as refused:
        await _refuse(send, refused)
        return None
    if resume is not None and resume.enabled:
        channel, held = resume.open(remote_address(scope), address_key=address_key)
        channel.count = count
        secret = broker.channel_secret(channel)
        greeting = Command(c=CHANNEL, i=channel.id, b=broker.broker_id, secret=secret)
        if count != 1:
            # Said back: the client counts as the broker logs (one from before
            # ``count`` says nothing, and then the client counts every frame).
            greeting = greeting.with_keys(count=str(count))
        router.send(channel, greeting)
        resume.greeted(channel, held)
        return channel, held
    channel, outbox = broker.open_websocket_channel(remote_address(scope), address_key=address_key)
    # The greeting carries the Channel secret (docs/protocol.md, "The Channel
    # secret"): this connection is the only place it is ever written.
    secret = broker.channel_secret(channel)
    router.send(channel, Command(c=CHANNEL, i=channel.id, b=broker.broker_id, secret=secret))
    return channel, outbox


async def _refuse(send: Send, refused: Refused) -> None:
    """Write the fault (as text, as a greeting would be), then close the WebSocket as
    policy violated."""
    await send({"type": "websocket.send", "text": refused.frame.decode("utf-8")})
    reason = f"{int(refused.code)} {refused.code.description}"
    await send({"type": "websocket.close", "code": CLOSE_REFUSED, "reason": reason})


async def _resume(
    scope: Scope,
    receive: Receive,
    send: Send,
    broker: Broker,
    resume: ChannelResume | None,
    address_key: str | None,
) -> tuple[Channel, StreamOutbox] | None:
    message = await receive()
    if message["type"] != "websocket.receive":
        return None
    data = message.get("bytes")
    text = data is None
    if data is None:
        data = (message.get("text") or "").encode("utf-8")

    # The server's SEND_FRAME extension (Uvicorn with gateway.transports.coalescing)
    # writes a frame without an ASGI send: the replay's hot loop. It declines while
    # the socket is paused, and the ASGI send then waits for the reader: a slow
    # reader holds the replay back instead of buffering the whole log.
    from gateway.transports.websocket import SEND_FRAME, SendFrame

    send_frame: SendFrame | None = (scope.get("extensions") or {}).get(SEND_FRAME)

    async def write(frame: bytes) -> None:
        as_text = text and _is_text(frame)
        if send_frame is not None and send_frame(frame, as_text):
            return
        if as_text:
            await send({"type": "websocket.send", "text": frame.decode("utf-8")})
        else:
            await send({"type": "websocket.send", "bytes": frame})

    try:
        if resume is None:
            raise Refused(FaultCode.RESUME_UNAVAILABLE, "this broker does not resume Channels")
        resumed = await resume.accept(
            data, write, remote=remote_address(scope), address_key=address_key
        )
    except Refused as refused:
        await write(refused.frame)
        reason = f"{int(refused.code)} {refused.code.description}"
        await send({"type": "websocket.close", "code": CLOSE_REFUSED, "reason": reason})
        return None
    resumed.channel.prefers_text = text
    return resumed.channel, resumed.outbox
