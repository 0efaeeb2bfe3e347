"""The lean RESP connection (gateway/engines/redis/resp.py) against private redis-servers:
pipelines in flight at once, error replies among good ones, NOSCRIPT, a Redis that dies
and comes back, a password (AUTH and HELLO 3), a database and a client name, TLS, a unix
socket, a silent Redis, a peer that does not speak RESP, and the Batcher on top of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import hiredis
import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.batch import Batcher, Call, fail_future, reply_error, settle_future
from gateway.engines.redis.connection import connect
from gateway.engines.redis.resp import RespConnection, open_connection
from gateway.engines.redis.scripts import Script
from tests.support import T
from tests.support.ports import listen_port
from tests.support.redis import RedisServer
from tests.support.tls import generate_tls_files

pytestmark = pytest.mark.anyio

INCR_BY = Script("test_incr_by", "return redis.call('INCRBY', KEYS[1], ARGV[1])")


def pack(*commands: tuple[Any, ...]) -> bytes:
    return b"".join(hiredis.pack_command(command) for command in commands)


def template(url: str) -> AbstractConnection:
    """An unconnected connection made as ``url``'s pool would make one."""
    pool = Redis.from_url(url, socket_connect_timeout=5 * T, socket_timeout=5 * T).connection_pool
    connection: AbstractConnection = pool.connection_class(**pool.connection_kwargs)
    return connection


@contextlib.asynccontextmanager
async def lean(url: str) -> AsyncIterator[RespConnection]:
    connection = await open_connection(template(url))
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


async def test_pipelines_in_flight_at_once_get_their_own_replies_in_order(
    redis_server: RedisServer,
) -> None:
    async with lean(redis_server.url) as connection:
        futures = [
            connection.execute(pack(("INCR", "n"), ("GET", "n"), ("ECHO", b"%d" % i)), 3)
            for i in range(200)
        ]
        replies = await asyncio.wait_for(asyncio.gather(*futures), 5 * T)
        assert [reply[2] for reply in replies] == [b"%d" % i for i in range(200)]
        assert [reply[0] for reply in replies] == list(range(1, 201))
        assert all(reply[1] == b"%d" % reply[0] for reply in replies)
        # Big replies arrive in many reads; one waiter gets them whole.
        big = b"x" * 1_000_000
        assert await connection.execute(pack(("SET", "big", big), ("GET", "big")), 2) == [
            b"OK",
            big,
        ]
        assert await connection.execute(b"", 0) == []
        assert connection.peer == f"127.0.0.1:{redis_server.port}"


async def test_an_error_reply_in_a_pipeline_is_a_value_and_the_rest_stay_in_step(
    redis_server: RedisServer,
) -> None:
    async with lean(redis_server.url) as connection:
        replies = await connection.execute(
            pack(("SET", "s", "text"), ("INCR", "s"), ("GET", "s"), ("NOSUCHCOMMAND",)), 4
        )
        assert replies[0] == b"OK"
        assert type(replies[1]) is ResponseError
        assert "not an integer" in str(replies[1])
        assert replies[2] == b"text"
        assert isinstance(replies[3], ResponseError)
        assert reply_error(replies[1]) is replies[1]
        # A script's error table inside a reply stays inside it.
        script = "return {1, redis.error_reply('QFULL /q'), 3}"
        (nested,) = await connection.execute(pack(("EVAL", script, 0)), 1)
        assert nested[0] == 1 and nested[2] == 3
        assert isinstance(reply_error(nested[1]), Exception)
        assert "QFULL" in str(nested[1])
        assert await connection.execute(pack(("PING",)), 1) == [b"PONG"]


async def test_noscript_is_redis_py_s_no_script_error(redis_server: RedisServer) -> None:
    async with lean(redis_server.url) as connection:
        (refused,) = await connection.execute(pack(("EVALSHA", INCR_BY.sha, 1, "k", 1)), 1)
        assert isinstance(refused, NoScriptError)
        await connection.execute(pack(("SCRIPT", "LOAD", INCR_BY.source)), 1)
        assert await connection.execute(pack(("EVALSHA", INCR_BY.sha, 1, "k", 2)), 1) == [2]


async def test_a_cancelled_waiter_leaves_the_next_pipeline_its_own_replies(
    redis_server: RedisServer,
) -> None:
    async with lean(redis_server.url) as connection:
        blocked = connection.execute(pack(("BLPOP", "nothing", 0.2 * T), ("ECHO", "first")), 2)
        blocked.cancel()
        after = connection.execute(
            pack(
                ("ECHO", "second"),
            ),
            1,
        )
        assert await asyncio.wait_for(after, 5 * T) == [b"second"]
        assert not connection.closed


async def test_a_redis_that_dies_fails_every_waiter_and_a_new_connection_works(
    redis_server: RedisServer,
) -> None:
    connection = await open_connection(template(redis_server.url))
    waiting = [connection.execute(pack(("BLPOP", f"q{i}", 0)), 1) for i in range(3)]
    await asyncio.to_thread(redis_server.kill)
    for future in waiting:
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(future, 5 * T)
    assert connection.closed
    with pytest.raises(RedisConnectionError, match="closed"):
        connection.execute(pack(("PING",)), 1)
    with pytest.raises(RedisConnectionError):
        await open_connection(template(redis_server.url))  # refused while it is down
    await asyncio.to_thread(redis_server.start)
    async with lean(redis_server.url) as again:
        assert await again.execute(pack(("PING",)), 1) == [b"PONG"]


async def test_a_silent_redis_times_the_pipeline_out_and_closes_the_connection(
    redis_server: RedisServer,
) -> None:
    pool = Redis.from_url(redis_server.url, socket_timeout=0.3 * T).connection_pool
    connection = await open_connection(pool.connection_class(**pool.connection_kwargs))
    try:
        # A reply within the timeout leaves the timer to look again later.
        assert await connection.execute(pack(("PING",)), 1) == [b"PONG"]
        os.kill(redis_server.pid, signal.SIGSTOP)
        try:
            first = connection.execute(pack(("PING",)), 1)
            second = connection.execute(pack(("PING",)), 1)
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(first, 5 * T)
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(second, 5 * T)
            assert connection.closed
        finally:
            os.kill(redis_server.pid, signal.SIGCONT)
    finally:
        connection.close()


async def test_a_busy_connection_is_checked_again_until_its_oldest_pipeline_is_late(
    redis_server: RedisServer,
) -> None:
    pool = Redis.from_url(redis_server.url, socket_timeout=0.5 * T).connection_pool
    connection = await open_connection(pool.connection_class(**pool.connection_kwargs))
    try:
        # Each BLPOP answers (nil) within the timeout; the timer fires while the next
        # one waits and looks again at that one's own deadline.
        for _ in range(3):
            (reply,) = await connection.execute(pack(("BLPOP", "none", 0.3 * T)), 1)
            assert reply is None
        assert not connection.closed
    finally:
        connection.close()


async def test_a_password_is_sent_with_auth_or_hello(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", options=["--requirepass", "s3cret"]) as server:
        base = f"redis://:s3cret@127.0.0.1:{server.port}"
        async with lean(f"{base}/2?client_name=lean-test&protocol=2") as connection:
            info, name = await connection.execute(
                pack(("CLIENT", "INFO"), ("CLIENT", "GETNAME")), 2
            )
            assert b" db=2 " in info and b" resp=2\n" in info
            assert name == b"lean-test"
        async with lean(f"{base}/0?protocol=3") as connection:
            (info,) = await connection.execute(pack(("CLIENT", "INFO")), 1)
            assert b" resp=3\n" in info
            # RESP3: a map of streams.
            await connection.execute(pack(("XADD", "st", "*", "k", "v")), 1)
            (read,) = await connection.execute(pack(("XREAD", "STREAMS", "st", "0-0")), 1)
            assert isinstance(read, dict) and list(read) == [b"st"]
        async with lean(f"redis://default:s3cret@127.0.0.1:{server.port}/0") as connection:
            assert await connection.execute(pack(("PING",)), 1) == [b"PONG"]
        with pytest.raises(AuthenticationError):
            await open_connection(template(f"redis://:wrong@127.0.0.1:{server.port}/0"))
        with pytest.raises(AuthenticationError):
            await open_connection(template(f"redis://:wrong@127.0.0.1:{server.port}/0?protocol=2"))
        # No password: the first pipeline's reply says so (NOAUTH), and the Batcher's
        # pipeline raises it as redis-py would: Redis cannot serve this connection.
        client = Redis.from_url(f"redis://127.0.0.1:{server.port}/0")
        batcher = Batcher(client, [])
        try:
            with pytest.raises(EngineUnavailable):
                await Echo.through(batcher, b"x")
        finally:
            await batcher.close()
            await client.aclose()


async def test_an_unknown_database_is_refused_at_connect(redis_server: RedisServer) -> None:
    with pytest.raises(ResponseError):
        await open_connection(template(f"redis://127.0.0.1:{redis_server.port}/99"))


async def test_tls_with_the_pool_s_certificate_settings(tmp_path: Path) -> None:
    files = generate_tls_files(tmp_path / "tls")
    tls_port = listen_port()
    options = [
        "--port", "0", "--tls-port", str(tls_port),
        "--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key),
        "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "no",
    ]  # fmt: skip
    with RedisServer(tmp_path / "redis", options=options):
        url = f"rediss://localhost:{tls_port}/0?ssl_ca_certs={files.ca}"
        async with lean(url) as connection:
            assert await connection.execute(pack(("SET", "k", "v"), ("GET", "k")), 2) == [
                b"OK",
                b"v",
            ]
        # Without the CA the server's certificate is not trusted.
        with pytest.raises(RedisConnectionError):
            await open_connection(template(f"rediss://localhost:{tls_port}/0"))


async def test_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    options = ["--unixsocket", str(path), "--unixsocketperm", "700"]
    with RedisServer(tmp_path / "redis", options=options):
        async with lean(f"unix://{path}?db=1") as connection:
            (info,) = await connection.execute(pack(("CLIENT", "INFO")), 1)
            assert b" db=1 " in info
            assert connection.peer == str(path)


@contextlib.asynccontextmanager
async def listener(
    answers: Sequence[bytes],
) -> AsyncIterator[int]:
    """A loopback listener (a peer that is not Redis): it writes each of ``answers``
    after each read, then waits for the client to close; its port."""
    handlers: list[asyncio.Task[None]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for reply in answers:
                await reader.read(65536)
                writer.write(reply)
                await writer.drain()
            await reader.read()  # until the client closes
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.create_task(answer(reader, writer)))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


async def test_a_tls_handshake_nobody_answers_times_out() -> None:
    """A listener that accepts and never speaks: the connect timeout holds."""
    async with listener([]) as port:
        pool = Redis.from_url(
            f"rediss://127.0.0.1:{port}/0", socket_connect_timeout=0.3 * T
        ).connection_pool
        with pytest.raises(RedisTimeoutError):
            await open_connection(pool.connection_class(**pool.connection_kwargs))
        # The same for a handshake: the listener takes AUTH and never answers.
        pool = Redis.from_url(
            f"redis://:pw@127.0.0.1:{port}/0", socket_connect_timeout=0.3 * T
        ).connection_pool
        with pytest.raises(RedisTimeoutError):
            await open_connection(pool.connection_class(**pool.connection_kwargs))


@pytest.mark.parametrize(
    ("answer", "then"),
    [
        (b"?what\r\n", "Protocol error"),  # not RESP
        (b"+PONG\r\n+PONG\r\n", None),  # one reply too many: the first is the answer
    ],
)
async def test_a_peer_out_of_step_closes_the_connection(answer: bytes, then: str | None) -> None:
    """A peer that does not answer RESP as asked (an intercepting listener)."""
    # The handshake first (one write: CLIENT SETINFO twice), then the answer.
    async with listener([b"+OK\r\n+OK\r\n", answer]) as port:
        connection = await open_connection(template(f"redis://127.0.0.1:{port}/0?protocol=2"))
        future = connection.execute(pack(("PING",)), 1)
        if then is None:
            assert await asyncio.wait_for(future, 5 * T) == [b"PONG"]
        else:
            with pytest.raises(RedisConnectionError, match=then):
                await asyncio.wait_for(future, 5 * T)
        assert connection.closed


async def test_only_redis_py_s_connection_kinds_are_followed() -> None:
    class Other(AbstractConnection):
        async def _connect(self) -> None:
            raise NotImplementedError

        def _host_error(self) -> str:
            return "other"

        def repr_pieces(self) -> list[tuple[str, Any]]:
            return []

    with pytest.raises(TypeError):
        await open_connection(Other())


class Echo(Call):
    """One ECHO through a Batcher."""

    __slots__ = ("future", "value")

    def __init__(self, value: bytes) -> None:
        self.value = value
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @classmethod
    async def through(cls, batcher: Batcher, value: bytes) -> Any:
        call = cls(value)
        batcher.submit(call)
        return await asyncio.wait_for(call.future, 10 * T)

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return [("ECHO", self.value)]

    def settle(self, replies: Sequence[Any]) -> None:
        settle_future(self.future, replies[0])

    def fail(self, error: BaseException) -> None:
        fail_future(self.future, error)


class IncrBy(Echo):
    def commands(self) -> Sequence[tuple[Any, ...]]:
        return [("EVALSHA", INCR_BY.sha, 1, "counter", self.value)]


async def test_the_batcher_keeps_its_connection_and_replaces_a_dead_one(
    redis_server: RedisServer,
) -> None:
    client = connect(redis_server.url, connect_timeout=5 * T, command_timeout=5 * T)
    assert isinstance(client, Redis)
    batcher = Batcher(client, [INCR_BY])
    try:
        await batcher.load_scripts()
        values = await asyncio.gather(*(Echo.through(batcher, b"%d" % i) for i in range(50)))
        assert values == [b"%d" % i for i in range(50)]
        assert await IncrBy.through(batcher, b"2") == 2
        # Redis restarts and forgets its scripts: the kept connection is dead, the
        # next pipeline opens a new one, and NOSCRIPT loads the scripts again.
        await asyncio.to_thread(redis_server.restart)
        assert await IncrBy.through(batcher, b"3") == 3  # no AOF: the counter restarted
        await asyncio.to_thread(redis_server.kill)
        with pytest.raises(EngineUnavailable):
            await Echo.through(batcher, b"down")
        await asyncio.to_thread(redis_server.start)
        assert await Echo.through(batcher, b"back") == b"back"
    finally:
        await batcher.close()
        await client.aclose()


async def test_resp3_pushes_are_no_command_s_reply(redis_server: RedisServer) -> None:
    """Client-side caching's invalidations (RESP3 pushes) are skipped, in a pipeline's
    replies or between pipelines, and the connection stays in step."""
    other = Redis.from_url(redis_server.url)
    try:
        async with lean(redis_server.url) as connection:
            replies = await connection.execute(
                pack(("CLIENT", "TRACKING", "ON"), ("GET", "k"), ("SET", "k", "1"), ("GET", "k")),
                4,
            )
            assert replies == [b"OK", None, b"OK", b"1"]
            await other.set("k", "2")  # invalidates k: a push with no pipeline waiting
            assert await connection.execute(pack(("GET", "k")), 1) == [b"2"]
            await other.set("k", "3")
            assert await connection.execute(pack(("ECHO", "x")), 1) == [b"x"]
            assert not connection.closed
    finally:
        await other.aclose()
