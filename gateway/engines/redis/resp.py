"""A lean RESP connection: packed pipelines written at once, replies parsed as they arrive.

Why not redis-py's connection for the hot paths: a Redis round trip costs the
broker's process CPU on every pipeline the Batcher writes and every XREAD the
routing plane's reader makes, and under a bus's load there are one of each per
loop turn on each broker (bench/cluster.py). 20,000 sequential PINGs measured
62-71 µs of process CPU per round trip through redis-py's
``send_packed_command`` and ``read_response`` (a StreamWriter's ``drain``, a
StreamReader, the parser's layers, and one ``await`` per reply), against 43-47
µs for a bare ``asyncio.Protocol`` that writes packed bytes with
``transport.write`` and parses in ``data_received`` (bench/README.md,
"The lean RESP connection").

Theory of operation
-------------------
:class:`RespConnection` is an :class:`asyncio.Protocol` with a
:class:`hiredis.Reader`. :meth:`RespConnection.execute` writes one pipeline
(already packed) and returns a future for its replies; the connection keeps a
FIFO of such waiters, each expecting a known number of replies. Redis answers
in order, so ``data_received`` feeds what arrived to the reader and hands the
parsed replies to the waiter at the head, resolving its future once it has all
of them: one wake-up per pipeline, not an ``await`` per reply.

Error replies are values (one per command, as in a pipeline), made by
redis-py's own table (:meth:`redis._parsers.BaseParser.parse_error`, the one
its hiredis parser uses): ``NOSCRIPT`` becomes :class:`NoScriptError`,
``MOVED`` :class:`MovedError`, anything unknown :class:`ResponseError`, and
so on. So :func:`gateway.engines.redis.batch.reply_error`, the NOSCRIPT reload
and the cluster's redirections read them as they read redis-py's.

A waiter whose caller gave up (a cancelled future) keeps its place: its
replies still arrive and are dropped, so the connection stays in step. Its
callers close it anyway when they are cancelled (the loop is going away, or a
reader blocked in XREAD should let go at once). A lost connection, a reply
that does not parse, a reply nobody waits for, or a waiter older than the
command timeout (a Redis that is there but silent) closes the connection and
fails every waiter with redis-py's :class:`~redis.exceptions.ConnectionError`
or :class:`~redis.exceptions.TimeoutError`, which the callers already handle
(``CONNECTION_ERRORS``: the Batcher's one retry on a new connection, then
``EngineUnavailable``). A closed connection is never reused.

*Connecting.* :func:`open_connection` takes an unconnected redis-py connection
(a pool's ``connection_class(**connection_kwargs)``, or a cluster node's: see
:func:`gateway.engines.redis.connection.node_connection`) and connects as that
connection would: TCP or a unix socket, TLS with the SSL context redis-py
builds from the same keyword arguments, TCP keepalive, the connect timeout;
then one pipeline of AUTH (or ``HELLO 3 AUTH`` for RESP3, or ``HELLO 3``),
``CLIENT SETNAME`` if a name is set, ``CLIENT SETINFO`` (errors ignored, as
redis-py does) and SELECT. Not followed: a ``redis_connect_func`` of one's
own (Sentinel's), and the retry of ``AUTH <password>`` alone for a Redis
older than 6.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import Any, Final, cast

import hiredis
from redis._parsers import BaseParser
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RespConnection", "open_connection"]

#: What the reader's ``gets`` returns while a reply is incomplete (a reply can
#: never be this object, where it can be ``False`` in RESP3).
_MORE: Final = object()
#: RESP3 pushes (out-of-band: invalidations, say) are no command's reply.
_PUSH: Final[type | None] = getattr(hiredis, "PushNotification", None)


class _Waiter:
    """One pipeline's future and the replies read for it so far."""

    __slots__ = ("count", "future", "replies", "since")

    def __init__(self, count: int, future: asyncio.Future[list[Any]], since: float) -> None:
        self.count = count
        self.future = future
        self.replies: list[Any] = []
        self.since = since


class RespConnection(asyncio.Protocol):
    """One connection to Redis; see the module docstring.

    Args:
        peer: how errors name the server (``host:port`` or a socket's path).
        timeout: seconds a pipeline may wait for its replies before the
            connection is closed (None: no limit).
        resp3: whether the connection speaks RESP3 (``HELLO 3``): pushes are
            then skipped.
    """

    def __init__(self, peer: str, *, timeout: float | None, resp3: bool = False) -> None:
        self._peer = peer
        self._timeout = timeout
        self._resp3 = resp3
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader(
            protocolError=InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_MORE,
        )
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._transport: asyncio.Transport | None = None
        #: Why the connection is closed (None while it is open).
        self._error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (lost, failed or closed): never reused."""
        return self._error is not None

    @property
    def peer(self) -> str:
        """The server, as errors name it."""
        return self._peer

    def execute(self, packed: bytes, count: int) -> asyncio.Future[list[Any]]:
        """Write ``packed`` (``count`` commands in RESP) and wait for their replies.

        The future's result is one reply per command, error replies as
        exceptions (module docstring).

        Raises:
            redis.exceptions.ConnectionError: the connection is closed (at once),
                or lost before every reply came (through the future).
            redis.exceptions.TimeoutError: through the future, no reply within
                the timeout.
        """
        if self._error is not None or self._transport is None:
            raise RedisConnectionError(f"Connection to {self._peer} is closed.")
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        if count <= 0:
            future.set_result([])
            return future
        since = self._loop.time() if self._timeout is not None else 0.0
        self._waiters.append(_Waiter(count, future, since))
        self._transport.write(packed)
        if self._timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(since + self._timeout, self._check_timeout)
        return future

    def close(self) -> None:
        """Close the connection; waiters still waiting fail with ``ConnectionError``."""
        self._fail(RedisConnectionError(f"Connection to {self._peer} was closed."), abort=False)

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's TCPTransport and UnixTransport
        # (the broker's loop by default: gateway.ops.loops) do not derive from
        # asyncio.Transport, though they are one.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc is not None else ""
        self._fail(RedisConnectionError(f"Connection to {self._peer} lost{reason}."), abort=False)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiters = self._waiters
        try:
            while waiters:
                waiter = waiters[0]
                replies = waiter.replies
                count = waiter.count
                while len(replies) < count:
                    reply = reader.gets()
                    if reply is _MORE:
                        return
                    if self._resp3 and _PUSH is not None and isinstance(reply, _PUSH):
                        continue
                    replies.append(reply)
                waiters.popleft()
                if not waiter.future.done():  # cancelled: its replies are dropped
                    waiter.future.set_result(replies)
            # Nobody waits: only a push may come now; anything else is out of step.
            while (reply := reader.gets()) is not _MORE:
                if not (self._resp3 and _PUSH is not None and isinstance(reply, _PUSH)):
                    raise InvalidResponse(f"a reply nobody waited for: {reply!r:.80}")
        except InvalidResponse as exc:
            self._fail(RedisConnectionError(f"Protocol error from {self._peer}: {exc}"))

    # -- failures ----------------------------------------------------------------

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._waiters or self._timeout is None:
            return
        due = self._waiters[0].since + self._timeout
        if due <= self._loop.time():
            self._fail(RedisTimeoutError(f"Timeout reading from {self._peer}"))
        else:
            self._timer = self._loop.call_at(due, self._check_timeout)

    def _fail(self, error: BaseException, *, abort: bool = True) -> None:
        if self._error is None:
            self._error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            # A stream out of step (or a silent Redis) is dropped at once; a close
            # of our own lets what was written go first.
            if abort:
                transport.abort()
            else:
                transport.close()
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)


async def open_connection(template: AbstractConnection) -> RespConnection:
    """Connect as ``template`` (an unconnected redis-py connection) would; see the module docstring.

    Its ``socket_connect_timeout`` bounds the connection and the handshake; its
    ``socket_timeout`` becomes the connection's timeout for every pipeline.

    Raises:
        redis.exceptions.ConnectionError: refused, unreachable, or the handshake
            failed (``AuthenticationError`` for bad credentials).
        redis.exceptions.TimeoutError: no connection within the connect timeout.
        redis.exceptions.ResponseError: the handshake was refused otherwise (an
            unknown database, say).
    """
    loop = asyncio.get_running_loop()
    resp3 = template.protocol == 3
    timeout = template.socket_timeout
    connect_timeout = template.socket_connect_timeout
    if isinstance(template, UnixDomainSocketConnection):
        peer = template.path
    elif isinstance(template, Connection):
        peer = f"{template.host}:{template.port}"
    else:
        raise TypeError(f"cannot connect like {type(template).__name__}")

    def made() -> RespConnection:
        return RespConnection(peer, timeout=timeout, resp3=resp3)

    try:
        async with asyncio.timeout(connect_timeout):
            if isinstance(template, UnixDomainSocketConnection):
                _, protocol = await loop.create_unix_connection(made, template.path)
            else:
                assert isinstance(template, Connection)
                tls = template.ssl_context.get() if isinstance(template, SSLConnection) else None
                transport, protocol = await loop.create_connection(
                    made, template.host, template.port, ssl=tls
                )
                _keepalive(template, transport)
    except TimeoutError as exc:
        raise RedisTimeoutError("Timeout connecting to server") from exc
    except OSError as exc:
        raise RedisConnectionError(f"Error {exc.errno} connecting to {peer}. {exc}") from exc
    try:
        async with asyncio.timeout(connect_timeout):
            await _handshake(protocol, template)
    except TimeoutError as exc:
        protocol.close()
        raise RedisTimeoutError("Timeout connecting to server") from exc
    except BaseException:
        protocol.close()
        raise
    return protocol


def _keepalive(template: Connection, transport: asyncio.BaseTransport) -> None:
    """TCP keepalive as redis-py sets it (asyncio already sets TCP_NODELAY)."""
    sock = transport.get_extra_info("socket")
    if sock is None or not template.socket_keepalive:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in template.socket_keepalive_options.items():  # type: ignore[attr-defined]  # a Mapping once set
            sock.setsockopt(socket.SOL_TCP, option, value)
    except (OSError, TypeError):
        transport.close()
        raise


async def _handshake(connection: RespConnection, template: AbstractConnection) -> None:
    """Credentials, protocol, client name, library info and database: one pipeline."""
    commands: list[tuple[Any, ...]] = []
    provider = template.credential_provider
    if provider is None and (template.username or template.password):
        provider = UsernamePasswordCredentialProvider(template.username, template.password)
    credentials: tuple[str, ...] | None = None
    if provider is not None:
        credentials = tuple(await provider.get_credentials_async())
    if template.protocol == 3:
        if credentials:
            if len(credentials) == 1:
                credentials = ("default", credentials[0])
            commands.append(("HELLO", 3, "AUTH", *credentials))
        else:
            commands.append(("HELLO", 3))
    elif credentials:
        commands.append(("AUTH", *credentials))
    checked = len(commands)
    if template.client_name:
        commands.append(("CLIENT", "SETNAME", template.client_name))
        checked += 1
    ignored = 0
    info = getattr(template, "driver_info", None)
    if info is not None:
        for field, value in (
            ("LIB-NAME", getattr(info, "formatted_name", None)),
            ("LIB-VER", getattr(info, "lib_version", None)),
        ):
            if value:
                commands.append(("CLIENT", "SETINFO", field, value))
                ignored += 1
    if template.db:
        commands.append(("SELECT", template.db))
    if not commands:
        return
    packed = b"".join(hiredis.pack_command(command) for command in commands)
    replies = await connection.execute(packed, len(commands))
    for index, reply in enumerate(replies):
        if checked <= index < checked + ignored:
            continue  # CLIENT SETINFO: older servers do not know it (redis-py ignores it too)
        if isinstance(reply, BaseException):
            raise reply
    if template.protocol == 3 and isinstance(replies[0], dict):
        proto = replies[0].get(b"proto", replies[0].get("proto"))
        if proto != 3:
            raise RedisConnectionError("Invalid RESP version")
