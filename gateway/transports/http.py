"""Stateless HTTP Channels (HTTP/1.0, 1.1 and 2): POST to send, GET to long-poll.

``POST /asbp`` carries one Command in the body. Without ``i`` it opens a
Channel first (§2.6: stateless User-Agents "MUST obtain a unique channel
identifier from the Broker and submit the channel identifier with all
subsequent commands"). The answer is always one Command: ``asbp.accepted``
with ``i`` (and ``u`` when the request had one), or a fault for what was
wrong before routing (malformed frame, unknown Channel). Whatever routing
produces, replies and routing faults alike, arrives through long-polls.

``GET /asbp?i=<channel>&after=<seq>`` long-polls the Channel's mailbox. It
acknowledges every Command numbered ``after`` or less, then returns what is
left, or waits up to the long-poll timeout and answers 204. Several Commands
come back as ``multipart/mixed`` (RFC 2046): a Command has no length field,
so each travels as one part with its own ``Content-Length`` and an
``ASBP-Seq`` header, and the client sends the highest ``ASBP-Seq`` it read as
``after`` next time. A response lost on the way is sent again; nothing the
broker accepted for the Channel is lost.

Media type: ``application/asbp``. The draft's ``Content-Encoding:
application`` and ``Transfer-Encoding: BINARY`` are not valid HTTP (see
docs/protocol.md), so we send neither, and always a ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from typing import TYPE_CHECKING, Final

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

import asbp
from asbp import Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from asbp.names import ACCEPTED, CHANNEL
from gateway.connections.addresses import TooManyChannels
from gateway.connections.channel_secret import HEADER, SECRET_KEY, cookie_name, matches
from gateway.connections.channels import Channel, ChannelKind
from gateway.connections.log_mailbox import LogMailbox
from gateway.connections.outboxes import Mailbox
from gateway.plane.base import PlaneUnavailable
from gateway.routing.sniff import sniff_command_id
from gateway.transports.handshakes import RETRY_AFTER, HandshakeBound, busy_message
from gateway.transports.handshakes import STATE_KEY as HANDSHAKES

if TYPE_CHECKING:
    from gateway.broker import Broker

__all__ = ["MEDIA_TYPE", "poll", "post"]

#: The media type of one Command.
MEDIA_TYPE: Final = "application/asbp"

_STATUS: Final = {
    FaultCode.INVALID_MESSAGE_SIZE: 413,
    FaultCode.HEADER_TOO_LARGE: 431,
    FaultCode.UNKNOWN_CHANNEL: 404,
    FaultCode.SLOW_CONSUMER: 410,
    FaultCode.TOO_MANY_CHANNELS: 429,
    FaultCode.DESTINATIONS_BUSY: 429,
}


def _fault(
    code: FaultCode, message: str, *, command_id: int | None = None, status: int | None = None
) -> Response:
    frame = asbp.encode(fault_command(code, message, command_id=command_id))
    status_code = _STATUS.get(code, 400) if status is None else status
    return Response(frame, status_code=status_code, media_type=MEDIA_TYPE)


def _busy(bound: HandshakeBound, command_id: int | None) -> Response:
    """``503`` with ``Retry-After`` and fault 2115: no Channel opened (gateway/transports/
    handshakes.py)."""
    message = busy_message(bound.limit)
    response = _fault(FaultCode.BROKER_BUSY, message, command_id=command_id, status=503)
    response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


def _unreachable(message: str, command_id: int | None = None) -> Response:
    """``503`` with ``Retry-After`` and fault 2005: the bus (the routing plane) did not
    answer. The Channel and what it was sent are intact; the clients back off for
    ``Retry-After`` (the SDKs honour it) instead of hammering a Redis on its way back."""
    response = _fault(FaultCode.ENGINE_UNAVAILABLE, message, command_id=command_id, status=503)
    response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


def _unfinished(status: int, message: str) -> Response:
    """A fault for a body that never arrived whole; the connection closes after it.

    What is left of the body would otherwise be read as the next request.
    """
    response = _fault(FaultCode.INVALID_MESSAGE_FORMAT, message, status=status)
    response.headers["Connection"] = "close"
    return response


def _gone(
    broker: Broker, channel_id: str, secret: str | None, command_id: int | None = None
) -> Response:
    """A closed Channel: why, to its owner only (the same answer as unknown to anyone else)."""
    why = broker.channels.why_closed(channel_id, secret)
    if why is FaultCode.SLOW_CONSUMER:
        return _fault(why, "the Channel was closed: its mailbox filled up", command_id=command_id)
    return _refused(command_id)


#: Bytes of an oversized request body read and thrown away before answering 413.
#: Answered over HTTP/1.1 before the body is in, Hypercorn closes the connection
#: while the body is still arriving, and the kernel then resets it: the client
#: sees a broken connection instead of the 413 and its fault. Reading a bounded
#: amount more lets every reasonable client read its answer; past this, the
#: broker stops reading and lets the connection go.
_DRAIN_BYTES: Final = 1024 * 1024


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None when it passes ``limit`` bytes.

    An oversized body is drained (up to ``_DRAIN_BYTES`` past the limit, and not
    kept) so that the client can still read the answer; see ``_DRAIN_BYTES``.
    """
    give_up = limit + _DRAIN_BYTES
    declared = request.headers.get("content-length")
    declared_size = int(declared) if declared is not None and declared.isdigit() else None
    if declared_size is not None and declared_size > give_up:
        return None
    too_large = declared_size is not None and declared_size > limit
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            too_large = True
            chunks.clear()
        if too_large:
            if size > give_up:
                return None
            continue
        chunks.append(chunk)
    return None if too_large else b"".join(chunks)


def _refused(command_id: int | None = None) -> Response:
    """The one answer to an unknown Channel and to a wrong or missing secret alike.

    Whoever holds only ``i`` must not learn whether the Channel exists.
    """
    return _fault(
        FaultCode.UNKNOWN_CHANNEL,
        "no such Channel for this secret (unknown, expired, or the secret is missing or"
        f" wrong: send it as {HEADER} or its cookie); POST without 'i' to open one",
        command_id=command_id,
    )


def _presented(request: Request, channel_id: str) -> str | None:
    """The secret the request carries: its header, else the Channel's cookie."""
    return request.headers.get(HEADER) or request.cookies.get(cookie_name(channel_id))


async def _owned_channel(
    broker: Broker, request: Request, channel_id: str | None, command_id: int | None = None
) -> Channel | Response:
    """The HTTP Channel ``channel_id`` if the request proves it owns it, else the answer.

    On a bus, a Channel another broker opened is looked up in the plane's
    Channel log (its secret's digest is there) and adopted here.
    """
    if not channel_id:
        return _refused(command_id)
    presented = _presented(request, channel_id)
    channel = broker.channels.get(channel_id)
    if channel is not None:
        if channel.kind is not ChannelKind.HTTP or not matches(presented, channel.secret_digest):
            return _refused(command_id)
        return channel
    if presented is None or not broker.plane.spans_brokers:
        return _gone(broker, channel_id, presented, command_id)
    try:
        digest = await broker.plane.channel_log.digest(channel_id)
    except PlaneUnavailable:
        return _unreachable("the bus is unreachable: send again in a moment", command_id)
    if digest is None or not matches(presented, digest):
        return _gone(broker, channel_id, presented, command_id)
    client = request.client
    return broker.adopt_http_channel(
        channel_id,
        digest,
        f"{client.host}:{client.port}" if client else "",
        address=client.host if client else None,
        tls=request.scope.get("scheme") == "https",
    )


def _set_secret(response: Response, request: Request, channel_id: str, secret: str) -> None:
    """Give the client the secret: a header for programs, a cookie for browsers.

    The cookie is ``HttpOnly`` (no script reads it) and ``Secure``; a page of
    another origin allowed by ``cors_origins`` gets ``SameSite=None`` (its
    requests are cross-site), the broker's own pages ``Strict``.
    """
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    cross = origin is not None and origin.split("://", 1)[-1].lower() != (host or "").lower()
    response.headers[HEADER] = secret
    response.set_cookie(
        cookie_name(channel_id),
        secret,
        path=request.scope["path"],  # not request.url: its query may not be UTF-8
        httponly=True,
        secure=True,
        samesite="none" if cross else "strict",
    )


async def post(request: Request) -> Response:
    """``POST /asbp``: one Command in, ``asbp.accepted`` (with ``i``) or a fault out."""
    broker: Broker = request.state.broker
    limits = broker.config.limits
    read_timeout = broker.config.channels.http_read_timeout
    try:
        async with asyncio.timeout(read_timeout):
            body = await _read_body(request, limits.max_frame_bytes)
    except TimeoutError:
        return _unfinished(408, f"the request body did not arrive in full within {read_timeout} s")
    except ClientDisconnect:
        # Uvicorn and Hypercorn answer a body cut short by end-of-file themselves
        # (see gateway.transports.h11_eof); this is for a client that vanished.
        return _unfinished(400, "the request body ended early")
    if body is None:
        return _fault(
            FaultCode.INVALID_MESSAGE_SIZE,
            f"a Command may not exceed {limits.max_frame_bytes} bytes",
        )
    try:
        command = asbp.decode(body, limits=limits)
    except ProtocolError as exc:
        return _fault(exc.code, exc.message, command_id=sniff_command_id(body))
    command_id = command.command_id
    if "i" in request.query_params:
        # Honouring it would give two places for one key that could disagree, and
        # ignoring it opened a new Channel per POST whose replies the client never saw.
        return _fault(
            FaultCode.INVALID_MESSAGE_FORMAT,
            "'i' goes in the Command's header (c=...,i=<Channel>;), not in the query string"
            " of a POST; only GET takes it there",
            command_id=command_id,
        )
    channel_id = command.channel_id
    if channel_id is None:
        bound: HandshakeBound | None = getattr(request.state, HANDSHAKES, None)
        if bound is not None and bound.turns_away():
            # The broker is past its handshakes in flight: open nothing now.
            return _busy(bound, command_id)
        client = request.client
        remote = f"{client.host}:{client.port}" if client else ""
        try:
            key = broker.address_limits.admit(client.host if client else None, http=True)
        except TooManyChannels as exc:
            response = _fault(exc.code, exc.message, command_id=command_id)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = str(exc.retry_after)
            return response
        channel, secret = broker.open_http_channel(
            remote,
            address=client.host if client else None,
            # The scope, not request.url: a query string that is not UTF-8 (HTTP/2 lets
            # one through) would make building the URL raise.
            tls=request.scope.get("scheme") == "https",
            address_key=key,
        )
    else:
        found = await _owned_channel(broker, request, channel_id, command_id)
        if isinstance(found, Response):
            return found
        channel = found
        secret = None
    channel.last_seen = time.monotonic()
    gate = channel.gate
    if gate.blocked:
        # Flow control: what this Channel published filled a destination's outbox.
        stall_timeout = broker.config.channels.flow_stall_timeout
        wait = gate.retry_after(stall_timeout)
        if wait > 0:
            response = _fault(
                FaultCode.DESTINATIONS_BUSY,
                "what this Channel sends fills its destinations faster than they read;"
                " send again after Retry-After",
                command_id=command_id,
            )
            response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            return response
        gate.give_up()  # a destination that did not drain in all that time has stopped
    if command.name != CHANNEL:
        # The frame too: the router forwards it as it is where it can, and the
        # event log takes the header's size from it. Never the secret: it is
        # not in the frame (the client sends it beside, as a header or cookie).
        if broker.http_bus is not None:
            # On a bus: to the Channel's home if it is about its Subjects.
            broker.http_bus.route(channel, command, body)
        else:
            broker.router.channel_command(channel, command, body)
    reply = Command(c=ACCEPTED, i=channel.id, b=broker.broker_id)
    if command_id is not None:
        reply = reply.with_keys(u=command_id)
    if secret is None:
        return Response(asbp.encode(reply), media_type=MEDIA_TYPE)
    response = Response(asbp.encode(reply.with_keys(**{SECRET_KEY: secret})), media_type=MEDIA_TYPE)
    _set_secret(response, request, channel.id, secret)
    return response


def _multipart(frames: list[tuple[int, bytes]]) -> tuple[bytes, str]:
    boundary = secrets.token_hex(16)
    marker = boundary.encode("ascii")
    while any(marker in frame for _, frame in frames):  # pragma: no cover - 2**-128
        boundary = secrets.token_hex(16)
        marker = boundary.encode("ascii")
    parts: list[bytes] = []
    for seq, frame in frames:
        parts.append(
            b"--%s\r\nContent-Type: %s\r\nContent-Length: %d\r\nASBP-Seq: %d\r\n\r\n%s\r\n"
            % (marker, MEDIA_TYPE.encode(), len(frame), seq, frame)
        )
    parts.append(b"--%s--\r\n" % marker)
    return b"".join(parts), boundary


async def _poll_until_gone(
    request: Request, mailbox: Mailbox, after: int, wait: float, limit: int
) -> list[tuple[int, bytes]]:
    """``mailbox.poll``, ended early (empty) when the client goes away.

    A parked poll would otherwise outlive its client by up to the long-poll
    timeout, and a server shutting down would wait for it.
    """
    polling = asyncio.ensure_future(mailbox.poll(after, wait, limit))
    if polling.done():
        return polling.result()
    watching = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({polling, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if polling.done():
        return polling.result()
    polling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await polling
    return []


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def poll(request: Request) -> Response:
    """``GET /asbp?i=..&after=..[&wait=..]``: the Channel's waiting Commands."""
    broker: Broker = request.state.broker
    params = request.query_params
    found = await _owned_channel(broker, request, params.get("i"))
    if isinstance(found, Response):
        return found
    channel = found
    limits = broker.config.channels
    try:
        after = int(params.get("after", "0"))
        wait = float(params.get("wait", limits.long_poll_timeout))
    except ValueError:
        return _fault(FaultCode.INVALID_MESSAGE_FORMAT, "'after' and 'wait' must be numbers")
    wait = max(0.0, min(wait, limits.long_poll_timeout))
    channel.last_seen = time.monotonic()
    mailbox = channel.outbox
    if isinstance(mailbox, LogMailbox):
        if broker.http_bus is not None:
            broker.http_bus.polled(channel)  # is its home still alive?
        return await _poll_log(request, broker, channel, after, wait)
    assert isinstance(mailbox, Mailbox)
    frames = await _poll_until_gone(request, mailbox, after, wait, limits.long_poll_max_frames)
    channel.last_seen = time.monotonic()
    if not frames:
        if channel.closed:
            return _gone(broker, channel.id, _presented(request, channel.id))
        return Response(status_code=204, headers={"ASBP-Last-Seq": str(mailbox.last_seq)})
    return _frames(frames)


def _frames(frames: list[tuple[int, bytes]]) -> Response:
    body, boundary = _multipart(frames)
    return Response(
        body,
        media_type=f'multipart/mixed; boundary="{boundary}"',
        headers={"ASBP-Last-Seq": str(frames[-1][0])},
    )


async def _poll_log(
    request: Request, broker: Broker, channel: Channel, after: int, wait: float
) -> Response:
    """A long-poll answered from the Channel's log in the plane (a bus of many brokers)."""
    limit = broker.config.channels.long_poll_max_frames
    reading = asyncio.ensure_future(broker.plane.channel_log.read(channel.id, after, limit, wait))
    watching = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if not reading.done():
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, PlaneUnavailable):
            await reading
        return Response(status_code=204)
    channel.last_seen = time.monotonic()
    try:
        read = reading.result()
    except PlaneUnavailable:
        return _unreachable("the bus is unreachable: poll again in a moment")
    if read is None:
        if broker.http_bus is not None:
            broker.http_bus.gone(channel)  # this copy goes too: 2104 from now on
        return _refused()  # closed or expired bus-wide
    if not read.frames:
        response = Response(status_code=204, headers={"ASBP-Last-Seq": str(read.last_seq)})
    else:
        response = _frames(list(read.frames))
    if read.lost_through > after:
        # Retention dropped Commands the client had not acknowledged: say which.
        response.headers["ASBP-Lost"] = f"{after + 1}-{read.lost_through}"
    return response
