"""The answering side of a Course: ``wss://host/course``, one peer bus per connection.

The handshake refuses, before accepting the WebSocket (an HTTP answer with the
fault's code in an ``asbp.fault`` body; the reason goes to the log only):

=========================================  ====  =====
plain ``ws://`` (unless the dev flag and    403   2206
both ends on loopback)
no credential, or one from a domain not     401   2203
listed in ``[courses]``
a signature or claims that do not verify    401   2204
(a peer claiming another bus's domain)
a credential seen before                    401   2205
=========================================  ====  =====

Accepted, the peer gets ``c=asbp.course,domain=<ours>;<signed answer>``
(courses.credential), then sends crossings; each is handed to
:meth:`courses.service.Courses.accept_batch` in the order received and acknowledged once
accepted, the acknowledgements of a burst batched into one ``asbp.course.ack``
whose ``course.id`` lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Final

from starlette.types import Message, Receive, Scope, Send

import asbp
from asbp import Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from courses.credential import answer_jti
from courses.service import Courses
from courses.wire import BATCH, HELLO, ID_KEY, ack_frame, unpack
from gateway.auth.credentials import CredentialRefused, RefusalReason, credential_from_headers
from gateway.messaging.eager import start_eagerly
from gateway.transports.asgi import is_loopback, remote_address
from gateway.transports.websocket import RECEIVE_FRAMES, ReceiveFrames

__all__ = ["course_endpoint"]

#: Acknowledgements sent in one Command at most: 200 ids of 33 bytes fit the 8 KiB header.
_MAX_ACKS: Final = 200

_BATCH_PREFIX: Final = f"c={BATCH};".encode()
#: Seconds between two acknowledgements on one Course at least while crossings keep
#: coming (the first after a pause goes on the next loop turn, and so does one of
#: _MAX_ACKS ids): a sender's window (1,024 by default) is not held up by it.
_ACK_EVERY: Final = 0.01
#: A crossing id in a header that does not decode (ids are 32 hex digits, courses.link).
_SNIFF_ID: Final = re.compile(rb"(?:^|,)course\.id=([0-9a-f]{32})(?=[,;]|$)")

_REFUSALS: Final = {
    RefusalReason.UNKNOWN_IDENTITY: FaultCode.COURSE_UNLISTED,
    RefusalReason.REPLAYED: FaultCode.COURSE_REPLAYED,
}


async def course_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    """ASGI app for ``/course``."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    # Mounted only on a broker with Courses (gateway/app.py), so they are there.
    courses: Courses = scope["state"]["courses"]
    log = courses.log
    remote = remote_address(scope)
    if scope.get("scheme") != "wss" and not (courses.allow_plain and is_loopback(scope)):
        log.warning("course.refused", extra={"remote": remote, "reason": "tls required"})
        await _deny(scope, send, 403, FaultCode.COURSE_PLAIN_TEXT, "Courses require TLS (wss://)")
        return
    headers = {
        bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
        for k, v in scope.get("headers", ())
    }
    try:
        verified = courses.credentials.verify(credential_from_headers(headers))
    except CredentialRefused as exc:
        code = _REFUSALS.get(exc.reason, FaultCode.COURSE_CREDENTIAL_REFUSED)
        log.warning(
            "course.refused",
            extra={"remote": remote, "reason": exc.reason.value, "detail": exc.message},
        )
        await _deny(scope, send, 401, code, code.description)
        return
    peer = verified.identity
    answer, _ = courses.signing.sign(
        peer, lifetime=courses.settings.credential_lifetime, jti=answer_jti(verified.jti)
    )
    await send({"type": "websocket.accept"})
    await send(
        {
            "type": "websocket.send",
            "bytes": asbp.encode(Command({"c": HELLO, "domain": courses.domain}, answer.encode())),
        }
    )
    log.info("course.accepted", extra={"peer": peer, "remote": remote})
    acks: list[str] = []
    ready = asyncio.Event()
    #: Set when a full acknowledgement's worth waits: sent without waiting out the pace.
    full = asyncio.Event()
    closed = False
    writer = asyncio.create_task(_acknowledge(send, acks, ready, full))

    async def take(data: bytes) -> bool:
        """One message's crossings accepted and queued for acknowledgement; False
        for one that is not crossings, which ends the Course."""
        try:
            crossings = _crossings(data)
        except (ProtocolError, ValueError) as exc:
            # A peer that sends what is not a crossing is broken or hostile: end
            # its Course (what it sent before this stays accepted).
            log.warning("course.bad_frame", extra={"peer": peer, "error": str(exc)})
            return False
        # Where this bus's recipients are, for the whole batch in one round of
        # lookups, before any of them is claimed (courses.service).
        located = await courses.locate(c for _, c, _ in crossings if c is not None)
        legible: list[tuple[str, Command, bytes | None]] = []
        for crossing_id, command, frame in crossings:
            if command is None:
                # Its id is legible but it does not decode here (a peer with larger
                # limits than ours): acknowledged and dropped, or it would come back
                # after every reconnection and hold the whole Course.
                log.warning("course.undecodable", extra={"peer": peer, "course_id": crossing_id})
            else:
                legible.append((crossing_id, command, frame))
        # The whole message claimed in one step, then delivered in order.
        await courses.accept_batch(peer, legible, located=located)
        acks.extend(crossing_id for crossing_id, _, _ in crossings)
        ready.set()
        if len(acks) >= _MAX_ACKS:
            full.set()
        return True

    # The read path (the server's RECEIVE_FRAMES, gateway.transports.websocket): where
    # accepting needs no round trip (memory claims, no routing plane), each message
    # is accepted as it is parsed, with no ``websocket.receive`` queued for this task
    # and no wake-up of it per message, as Channels and Tubes take their frames. A
    # message whose acceptance does wait (a crossing stored for a further Course)
    # stops the read path: the next messages queue for this task, which takes them
    # once that one is accepted, so they keep their order, and reopens it.
    extensions = scope.get("extensions") or {}
    receive_frames: ReceiveFrames | None = (
        extensions.get(RECEIVE_FRAMES) if courses.accepts_at_once else None
    )
    loop = asyncio.get_running_loop()
    #: What the read path handed over: a message still being accepted (or refused).
    handed: asyncio.Future[asyncio.Future[bool]] = loop.create_future()

    def on_frame(data: bytes, _text: bool) -> None:
        step = start_eagerly(take(data), task=True)
        if step.done() and step.exception() is None and step.result():
            return
        assert receive_frames is not None
        receive_frames(None)
        handed.set_result(step)

    async def next_message() -> Message:
        message = await receive()
        # Taken out of the queue: in this same step the read path stops, so that
        # nothing read after it is accepted before it.
        assert receive_frames is not None
        receive_frames(None)
        return message

    if receive_frames is not None:
        receive_frames(on_frame)
    #: The next message from the server's queue (the read path is stopped, or the
    #: server has none).
    getter: asyncio.Future[Message] | None = None
    try:
        while True:
            if receive_frames is None:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    closed = True
                    break
                if not await take(_data(message)):
                    break
                continue
            if getter is None:
                getter = asyncio.ensure_future(next_message())
            if not handed.done() and not getter.done():
                await asyncio.wait((getter, handed), return_when=asyncio.FIRST_COMPLETED)
            if handed.done():
                # Read before anything the queue holds (the read path stopped then).
                step, handed = handed.result(), loop.create_future()
            else:
                message, getter = getter.result(), None
                if message["type"] == "websocket.disconnect":
                    closed = True
                    break
                step = start_eagerly(take(_data(message)), task=True)
            if not await step:
                break
            if getter is None or not getter.done():
                # Nothing taken from the queue waits: the read path again.
                receive_frames(on_frame)
    finally:
        if receive_frames is not None:
            receive_frames(None)
        if getter is not None:
            getter.cancel()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await writer
        if not closed:
            with contextlib.suppress(OSError, RuntimeError):
                await send({"type": "websocket.close", "code": 1008})
        log.info("course.closed", extra={"peer": peer})


def _data(message: Message) -> bytes:
    data = message.get("bytes")
    return data if data is not None else (message.get("text") or "").encode("utf-8")


def _crossings(data: bytes) -> list[tuple[str, Command | None, bytes]]:
    """The crossings of one WebSocket message (one, or a batch), each with its id
    and its bytes; None for one whose id is legible but which does not decode.

    Raises:
        ProtocolError: a batch frame that does not decode.
        ValueError: a batch that does not parse, or a crossing without a legible
            ``course.id``.
    """
    frames = unpack(asbp.decode(data).body) if data.startswith(_BATCH_PREFIX) else [data]
    crossings: list[tuple[str, Command | None, bytes]] = []
    for frame in frames:
        crossing: Command | None
        try:
            crossing = asbp.decode(frame)
        except ProtocolError:
            crossing = None
            found = _SNIFF_ID.search(frame, 0, frame.find(b";") if b";" in frame else len(frame))
            crossing_id = found[1].decode("ascii") if found else None
        else:
            value = crossing.get(ID_KEY)
            crossing_id = value if isinstance(value, str) else None
        if crossing_id is None:
            raise ValueError("a crossing without a legible course.id")
        crossings.append((crossing_id, crossing, frame))
    return crossings


async def _acknowledge(
    send: Send, acks: list[str], ready: asyncio.Event, full: asyncio.Event
) -> None:
    """Send what was accepted, as few Commands as the pace allows: while crossings
    keep coming, at most one per :data:`_ACK_EVERY`, unless a full one
    (:data:`_MAX_ACKS` ids) is waiting (``full``)."""
    loop = asyncio.get_running_loop()
    last = -_ACK_EVERY
    while True:
        await ready.wait()
        # One loop turn more at least: crossings that arrived meanwhile share this
        # acknowledgement, which is off every Command's path (a sender needs it
        # only to free its window and its queue). Under load, until the pace
        # allows: each acknowledgement costs both buses a WebSocket message.
        pause = last + _ACK_EVERY - loop.time()
        if pause > 0 and len(acks) < _MAX_ACKS:
            full.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(full.wait(), pause)
        else:
            await asyncio.sleep(0)
        ready.clear()
        full.clear()
        while acks:
            batch = acks[:_MAX_ACKS]
            del acks[:_MAX_ACKS]
            await send({"type": "websocket.send", "bytes": ack_frame(batch)})
        last = loop.time()


async def _deny(scope: Scope, send: Send, status: int, code: FaultCode, message: str) -> None:
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    frame = asbp.encode(fault_command(code, message))
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/asbp"),
                (b"content-length", str(len(frame)).encode()),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": frame})
