"""WebSocket transports: User-Agent Channels and Application-Agent Tubes.

Both are plain ASGI applications rather than Starlette endpoints: every
message crosses this code, and Starlette's WebSocket wrapper costs a few
microseconds per message that a broker pays on every hop.

Each connection has two tasks. The one that ASGI gave us reads messages and
hands them to the router, which never blocks; a writer task drains the
connection's outbox (while it waits, the outbox hands frames to its ``send``
directly: see ``_write``). A reader that falls behind fills its outbox, and the
router closes it with fault 2105 instead of letting it hold memory.

On a server that offers them (Uvicorn with gateway.transports.coalescing), two
ASGI extensions skip the per-message ASGI machinery on the hot paths, with the
same frames and the same order: RECEIVE_FRAMES hands each message read to the
router as it is parsed (the receive loop still takes everything else), and
SEND_FRAME writes a frame without an ASGI ``send``. Elsewhere (Hypercorn) the
plain ASGI path runs, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from asbp import FaultCode, Limits, encode
from asbp.fault_commands import fault_command
from gateway.auth.credentials import CredentialRefused, RefusalReason, credential_from_headers
from gateway.auth.throttle import HandshakeThrottle
from gateway.connections.addresses import TooManyChannels
from gateway.connections.channels import Channel
from gateway.connections.finish import finish as _finish
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.resume import HeldOutbox
from gateway.connections.tubes import Tube
from gateway.transports import cors
from gateway.transports.asgi import Receive, Scope, Send, is_loopback, remote_address
from gateway.transports.resume_ws import open_channel

if TYPE_CHECKING:
    from gateway.broker import Broker

__all__ = [
    "RECEIVE_FRAMES",
    "SEND_FRAME",
    "ReceiveFrames",
    "SendFrame",
    "channel_endpoint",
    "max_message_bytes",
    "tube_endpoint",
]

#: The ASGI extension (in ``scope["extensions"]``) of a server that can write a
#: WebSocket message without an ASGI ``send``: a :data:`SendFrame`
#: (gateway.transports.coalescing offers it on Uvicorn).
SEND_FRAME: Final = "asbp.send_frame"
#: Write ``payload`` as one message (text if the flag is set, else binary) now,
#: without waiting; False if it did nothing and the ASGI ``send`` must be used.
SendFrame = Callable[[bytes, bool], bool]
#: The ASGI extension of a server that can hand messages to a function as they are
#: read, instead of as ``websocket.receive`` events: a :data:`ReceiveFrames`.
RECEIVE_FRAMES: Final = "asbp.receive_frames"
#: ``receive_frames(handler)``: from now on, call ``handler(payload, text)`` with
#: each message read while no event waits for ``receive`` (the others still come
#: through ``receive``, in order); ``receive_frames(None)`` stops it.
ReceiveFrames = Callable[[Callable[[bytes, bool], None] | None], object]

#: The subprotocol we select when a client offers it.
SUBPROTOCOL: Final = "asbp"
#: WebSocket close code for a reader the broker gave up on (policy violation).
CLOSE_SLOW: Final = 1008
#: WebSocket close code for a Channel past a per-address limit (policy violation).
CLOSE_POLICY: Final = 1008
#: WebSocket close code when the broker shuts down ("going away").
CLOSE_GOING_AWAY: Final = 1001
#: WebSocket close code when a broker on a bus stops and hands its Channels and
#: Tubes to the others ("Service Restart"): resume or reconnect elsewhere at once.
CLOSE_SERVICE_RESTART: Final = 1012


def max_message_bytes(limits: Limits) -> int:
    """The largest WebSocket message a server should read for a broker with ``limits``.

    Four ASBP frames' worth: a message a little over ``max_frame_bytes`` still
    reaches the broker and is answered with fault 1101 on an open connection
    (the client learns which Command was refused, by its ``u``), while one far
    over it is refused by the server (close 1009) before it is buffered whole.
    Both servers are given the same figure (Hypercorn's
    ``websocket_max_message_size``, Uvicorn's ``ws_max_size``), so a client
    meets the same limit on either; their own default (16 MiB) let every
    connection hold 16 MiB for a message the broker would refuse anyway.
    """
    return 4 * limits.max_frame_bytes


def _broker(scope: Scope) -> Broker:
    broker: Broker = scope["state"]["broker"]
    return broker


def _subprotocol(scope: Scope) -> str | None:
    return SUBPROTOCOL if SUBPROTOCOL in scope.get("subprotocols", ()) else None


def _is_text(frame: bytes) -> bool:
    if frame.isascii():
        return True
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _write(
    outbox: StreamOutbox, send: Send, peer: Channel | Tube, send_frame: SendFrame | None = None
) -> None:
    """Drain ``outbox`` to the peer until it closes, then close the socket.

    While this task waits for frames, the outbox hands them to ``send_now``
    instead of waking it (StreamOutbox.send_directly): ``send_now`` runs the
    ASGI ``send`` coroutine's first step on the spot. An ASGI server's
    ``send`` of a WebSocket message writes to its transport and returns
    without suspending unless the transport is paused (the reader is slow) or
    busy, so a fan-out to a thousand subscribers costs a thousand such calls,
    as ``websockets.broadcast`` does, instead of a thousand task wake-ups. A
    ``send`` that does suspend is finished by a task of its own (``stalled``);
    from then on ``send_now`` declines, so the next frames wake this task,
    which waits for ``stalled`` (and meets its failure, if it failed) before
    sending them: frames keep their order. A ``send`` that fails in its first
    step is left to this task too: it meets the same failure in its own
    ``send`` and handles it as before.

    With ``send_frame`` (the server's SEND_FRAME extension), a frame is first
    offered to it, here and in this task's own sends: it writes the message
    with no ASGI ``send`` at all, or declines wherever that ``send`` would
    wait or do more, and the frame takes the ASGI path as before. It is never
    offered a frame while a ``send`` is unfinished, so the order holds.
    """
    channel = peer if isinstance(peer, Channel) else None
    stalled: asyncio.Task[None] | None = None
    direct = True

    def message(frame: bytes) -> dict[str, Any]:
        if channel is not None and channel.prefers_text and _is_text(frame):
            return {"type": "websocket.send", "text": frame.decode("utf-8")}
        return {"type": "websocket.send", "bytes": frame}

    def shortcut(frame: bytes) -> bool:
        assert send_frame is not None
        # A text frame's payload is the frame itself: _is_text found it UTF-8.
        return send_frame(frame, channel is not None and channel.prefers_text and _is_text(frame))

    def send_now(frame: bytes) -> bool:
        nonlocal stalled, direct
        if not direct or stalled is not None:
            return False
        if send_frame is not None and shortcut(frame):
            return True
        steps = send(message(frame)).__await__()
        try:
            waiting_on = steps.send(None)
        except StopIteration:
            return True
        except Exception:
            # Not here, inside a fan-out: this task meets it again in its own send.
            direct = False
            return False
        stalled = asyncio.ensure_future(_finish(steps, waiting_on))
        return True

    outbox.send_directly(send_now)
    try:
        while True:
            batch = await outbox.take()
            if stalled is not None:
                await stalled
                stalled = None
            if not batch:
                break
            for frame in batch:
                if send_frame is None or not shortcut(frame):
                    await send(message(frame))
        fault = peer.fault
        if fault is FaultCode.SLOW_CONSUMER:
            reason = f"{int(fault)} {fault.description}"
            await send({"type": "websocket.close", "code": CLOSE_SLOW, "reason": reason})
        elif fault is FaultCode.BROKER_RESTARTING:
            # Drained (gateway.drain): the client resumes at another broker now,
            # so the log must hold what it was sent first.
            reason = f"{int(fault)} {fault.description}"
            if isinstance(outbox, HeldOutbox):
                await outbox.logged()
                # Sealed in the same step as the close is sent: ``read`` is final.
                outbox.sealed = True
                reason = f"{reason}; read={outbox.read}"
            await send({"type": "websocket.close", "code": CLOSE_SERVICE_RESTART, "reason": reason})
        elif fault is FaultCode.CHANNEL_RESUMED:
            # Another connection took the Channel over (gateway.connections.resume).
            reason = f"{int(fault)} {fault.description}"
            await send({"type": "websocket.close", "code": CLOSE_GOING_AWAY, "reason": reason})
        else:
            await send({"type": "websocket.close", "code": CLOSE_GOING_AWAY})
    except OSError:  # pragma: no cover - the peer vanished mid-send; nothing to tell it
        pass
    finally:
        outbox.send_directly(None)
        if stalled is not None:
            if not stalled.done():
                stalled.cancel()
            elif not stalled.cancelled():
                stalled.exception()  # retrieved: the peer is gone, whatever it was


def _origin_and_host(scope: Scope) -> tuple[str | None, str | None]:
    """The ``Origin`` and ``Host`` headers (the last of each, as a dict of them keeps).

    Read without building a dict of every header: this endpoint's frame lives as
    long as its Channel, and such a dict held about half a KiB per idle Channel
    (bench/soak.py).
    """
    origin = host = None
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    return origin, host


def _counted(
    frame_for: Callable[[Channel, bytes], None], outbox: HeldOutbox
) -> Callable[[Channel, bytes], None]:
    """``frame_for`` for a resumable Channel: it counts what it routes, and routes
    nothing once its broker sealed it to hand it over (gateway.drain): the close
    says how many frames were routed, and the client sends the rest again where
    it resumes. (Uvicorn drops what arrives after a close anyway.)"""

    def route(channel: Channel, data: bytes) -> None:
        if outbox.sealed:
            return
        outbox.read += 1
        frame_for(channel, data)

    return route


async def channel_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    """ASGI app for ``ws(s)://host/asbp``: one User-Agent Channel."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    broker = _broker(scope)
    origin, host = _origin_and_host(scope)
    # Browsers apply no CORS to WebSockets: the broker checks the page's origin itself.
    if not cors.is_allowed(origin, host, cors.allowed_origins(broker.config.cors_origins)):
        why = f"origin {origin} is not allowed here (cors_origins)"
        await _deny(scope, send, 403, FaultCode.ACCESS_DENIED, why)
        return
    await send({"type": "websocket.accept", "subprotocol": _subprotocol(scope)})
    client = scope.get("client")
    try:
        key = broker.address_limits.admit(str(client[0]) if client else None, http=False)
    except TooManyChannels as exc:
        # Accepted first, so that the fault reaches the client: a refused handshake
        # tells a browser nothing but "failed".
        fault = encode(fault_command(exc.code, exc.message))
        await send({"type": "websocket.send", "bytes": fault})
        reason = f"{int(exc.code)} {exc.code.description}"
        await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": reason})
        return
    # Greeted (with the Channel secret) or resumed: gateway.transports.resume_ws.
    opened = await open_channel(scope, receive, send, broker, key)
    if opened is None:
        return
    channel, outbox = opened
    router = broker.router
    extensions = scope.get("extensions") or {}
    writer = asyncio.create_task(_write(outbox, send, channel, extensions.get(SEND_FRAME)))
    frame_for: Callable[[Channel, bytes], None] = router.channel_frame
    if isinstance(outbox, HeldOutbox):
        frame_for = _counted(frame_for, outbox)
    gate = channel.gate
    stall_timeout = broker.config.channels.flow_stall_timeout
    receive_frames: ReceiveFrames | None = extensions.get(RECEIVE_FRAMES)
    shortcut = receive_frames is not None
    if receive_frames is not None:

        def on_frame(data: bytes, text: bool) -> None:
            nonlocal shortcut
            channel.prefers_text = text
            frame_for(channel, data)
            if gate.held and receive_frames is not None:
                # Held back: the next messages wait in the server's queue, which
                # stops reading the socket, until the loop below lets them in.
                shortcut = False
                receive_frames(None)

        receive_frames(on_frame)
    try:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.receive":
                if gate.held:
                    await gate.wait(stall_timeout)
                data = message.get("bytes")
                if data is None:
                    channel.prefers_text = True
                    data = (message.get("text") or "").encode("utf-8")
                else:
                    channel.prefers_text = False
                frame_for(channel, data)
                if not shortcut and receive_frames is not None and not gate.held:
                    shortcut = True
                    receive_frames(on_frame)
            elif kind == "websocket.disconnect":
                break
    finally:
        if receive_frames is not None:
            receive_frames(None)
        closed_by_peer = not channel.closed
        broker.close_channel(channel)
        if closed_by_peer:
            writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer


async def _deny(
    scope: Scope,
    send: Send,
    status: int,
    code: FaultCode,
    message: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Refuse a WebSocket handshake with an HTTP status, ``headers`` and a fault body."""
    if "websocket.http.response" in scope.get("extensions", {}):
        frame = encode(fault_command(code, message))
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/asbp"),
                    (b"content-length", str(len(frame)).encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": frame})
    else:
        await send({"type": "websocket.close", "code": 1008})


async def tube_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    """ASGI app for ``wss://host/tube``: one Application-Agent Tube."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    broker = _broker(scope)
    remote = remote_address(scope)
    secure = scope.get("scheme") == "wss"
    if not secure and not (broker.config.insecure_dev_tubes and is_loopback(scope)):
        broker.log.warning("tube.refused", extra={"remote": remote, "reason": "tls required"})
        await _deny(
            scope,
            send,
            403,
            FaultCode.INVALID_AUTHENTICATION_CHANNEL_TYPE,
            "Tubes require TLS (wss://)",
        )
        return
    # Failed handshakes are counted per client address (an IPv6 /64): past the
    # budget the credential is not even looked at. No await between allow() and
    # failed(), so concurrent handshakes from one address cannot overdraw it.
    throttle: HandshakeThrottle = scope["state"]["throttle"]
    client = scope.get("client")
    address = str(client[0]) if client else ""
    if not throttle.allow(address):
        retry_after = throttle.retry_after_header(address)
        # The first refusal is a warning; the rest of a flood only at debug level,
        # so a peer hammering the port cannot flood the log through this path.
        refusals = throttle.refusals(address)
        broker.log.log(
            logging.WARNING if refusals == 1 else logging.DEBUG,
            "tube.refused",
            extra={
                "remote": remote,
                "reason": "throttled",
                "retry_after": retry_after,
                "refusals": refusals,
            },
        )
        await _deny(
            scope,
            send,
            429,
            FaultCode.AUTHENTICATION_FAILED,
            "too many failed handshakes from this address; retry later",
            headers=[(b"retry-after", str(retry_after).encode())],
        )
        return
    headers = {
        bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
        for k, v in scope.get("headers", ())
    }
    credentials = broker.credentials
    try:
        if credentials is None:
            raise CredentialRefused(
                RefusalReason.UNKNOWN_IDENTITY, "no Application-Agents are configured"
            )
        verified = credentials.verify(credential_from_headers(headers))
    except CredentialRefused as exc:
        throttle.failed(address)
        broker.log.warning(
            "tube.refused",
            extra={"remote": remote, "reason": exc.reason.value, "detail": exc.message},
        )
        # The peer learns only that authentication failed; the reason is
        # logged, so probing cannot tell an unknown identity from a bad key.
        await _deny(scope, send, 401, FaultCode.AUTHENTICATION_FAILED, "authentication failed")
        return
    throttle.succeeded(address)
    await send({"type": "websocket.accept", "subprotocol": _subprotocol(scope)})
    tube, outbox = broker.open_tube(verified.identity, remote)
    extensions = scope.get("extensions") or {}
    writer = asyncio.create_task(_write(outbox, send, tube, extensions.get(SEND_FRAME)))
    router = broker.router
    frame_for = router.tube_frame
    gate = tube.gate
    stall_timeout = broker.config.channels.flow_stall_timeout
    receive_frames: ReceiveFrames | None = extensions.get(RECEIVE_FRAMES)
    shortcut = receive_frames is not None

    def on_frame(data: bytes, _text: bool) -> None:
        nonlocal shortcut
        frame_for(tube, data)
        if gate.held and receive_frames is not None:
            shortcut = False  # held back, as a Channel is (channel_endpoint)
            receive_frames(None)

    if receive_frames is not None:
        receive_frames(on_frame)
    try:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.receive":
                if gate.held:
                    await gate.wait(stall_timeout)
                data = message.get("bytes")
                if data is None:
                    data = (message.get("text") or "").encode("utf-8")
                frame_for(tube, data)
                if not shortcut and receive_frames is not None and not gate.held:
                    shortcut = True
                    receive_frames(on_frame)
            elif kind == "websocket.disconnect":
                break
    finally:
        if receive_frames is not None:
            receive_frames(None)
        closed_by_peer = not tube.closed
        router.close_tube(tube)
        if closed_by_peer:
            writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
