"""Self-tests of :mod:`tests.support`, each helper against the real thing it wraps.

Every end-to-end test trusts these helpers, so they are checked with real clients: httpx,
curl and websockets against Hypercorn and Uvicorn, and redis-py against ``redis-server``.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import redis
from cryptography import x509
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from tests.support import (
    RedisServer,
    RedisServerError,
    RunningServer,
    ServerFailed,
    ServerName,
    T,
    TlsFiles,
    client_ssl_context,
    free_port,
    generate_tls_files,
    listen_port,
    serve_app,
    serve_app_async,
)
from tests.support.redis import READY_MARKER
from tests.support.timing import ENV_VAR, timeout_unit
from tests.support.tls import SERVER_NAMES

SERVERS: tuple[ServerName, ...] = ("hypercorn", "uvicorn")
ERROR_LOGGERS: dict[ServerName, str] = {"hypercorn": "hypercorn.error", "uvicorn": "uvicorn.error"}


async def http_version(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.scope["http_version"])


async def fail(request: Request) -> PlainTextResponse:
    raise RuntimeError("deliberate failure")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async for message in websocket.iter_text():
        await websocket.send_text(message)


def make_app() -> Starlette:
    return Starlette(
        routes=[Route("/version", http_version), Route("/fail", fail), WebSocketRoute("/ws", echo)]
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return generate_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(params=SERVERS)
def server_name(request: pytest.FixtureRequest) -> ServerName:
    name: ServerName = request.param
    return name


@pytest.fixture
def server(server_name: ServerName) -> Iterator[RunningServer]:
    with serve_app(make_app(), server=server_name) as running:
        yield running


@pytest.fixture
def tls_server(server_name: ServerName, tls_files: TlsFiles) -> Iterator[RunningServer]:
    with serve_app(make_app(), server=server_name, tls=tls_files) as running:
        yield running


@pytest.fixture
def hypercorn_server() -> Iterator[RunningServer]:
    with serve_app(make_app()) as running:
        yield running


def curl(*args: str) -> tuple[str, str]:
    """Run curl; return the body and the HTTP version of the response."""
    options = ["--silent", "--show-error", "--fail", "--max-time", f"{5 * T:g}"]
    result = subprocess.run(
        ["curl", *options, "--write-out", r"\n%{http_version}", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=10 * T,
    )
    body, _, version = result.stdout.rpartition("\n")
    return body, version


# HTTP


def test_urls(server: RunningServer, server_name: ServerName) -> None:
    assert server.server == server_name
    assert server.http_url == f"http://127.0.0.1:{server.port}"
    assert server.ws_url == f"ws://127.0.0.1:{server.port}"


def test_http11(server: RunningServer) -> None:
    with httpx.Client(base_url=server.http_url, timeout=5 * T) as client:
        response = client.get("/version")
    assert response.http_version == "HTTP/1.1"
    assert response.text == "1.1"


def test_https11(tls_server: RunningServer, tls_files: TlsFiles) -> None:
    assert tls_server.http_url == f"https://127.0.0.1:{tls_server.port}"
    verify = client_ssl_context(tls_files)
    with httpx.Client(base_url=tls_server.http_url, verify=verify, timeout=5 * T) as client:
        response = client.get("/version")
    assert response.text == "1.1"


def test_http10_with_curl(hypercorn_server: RunningServer) -> None:
    body, _ = curl("--http1.0", f"{hypercorn_server.http_url}/version")
    # Only the request is HTTP/1.0: h11 answers with its own version, HTTP/1.1, as RFC 9110
    # section 6.2 allows.
    assert body == "1.0"


def test_h2c_prior_knowledge_with_curl(hypercorn_server: RunningServer) -> None:
    assert curl("--http2-prior-knowledge", f"{hypercorn_server.http_url}/version") == ("2", "2")


@pytest.mark.anyio
async def test_h2c_prior_knowledge_with_httpx(hypercorn_server: RunningServer) -> None:
    async with httpx.AsyncClient(http1=False, http2=True, timeout=5 * T) as client:
        response = await client.get(f"{hypercorn_server.http_url}/version")
    assert response.http_version == "HTTP/2"
    assert response.text == "2"


@pytest.mark.anyio
@pytest.mark.parametrize(("h2", "expected"), [(None, "2"), (True, "2"), (False, "1.1")])
async def test_https_alpn(tls_files: TlsFiles, h2: bool | None, expected: str) -> None:
    verify = client_ssl_context(tls_files)
    with serve_app(make_app(), tls=tls_files, h2=h2) as running:
        async with httpx.AsyncClient(http2=True, verify=verify, timeout=5 * T) as client:
            response = await client.get(f"{running.http_url}/version")
    assert response.text == expected


def test_uvicorn_refuses_h2() -> None:
    with pytest.raises(ValueError, match="zttp"), serve_app(make_app(), server="uvicorn", h2=True):
        pass


@pytest.mark.anyio
async def test_serve_app_async(server_name: ServerName) -> None:
    async with (
        serve_app_async(make_app(), server=server_name) as running,
        httpx.AsyncClient(timeout=5 * T) as client,
    ):
        response = await client.get(f"{running.http_url}/version")
    assert response.text == "1.1"


# WebSocket


@pytest.mark.anyio
async def test_websocket_echo(server: RunningServer) -> None:
    with anyio.fail_after(5 * T):
        async with connect(f"{server.ws_url}/ws") as websocket:
            await websocket.send("hello")
            assert await websocket.recv() == "hello"


@pytest.mark.anyio
async def test_websocket_echo_over_tls(tls_server: RunningServer, tls_files: TlsFiles) -> None:
    assert tls_server.ws_url == f"wss://127.0.0.1:{tls_server.port}"
    with anyio.fail_after(5 * T):
        async with connect(f"{tls_server.ws_url}/ws", ssl=client_ssl_context(tls_files)) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"


# Lifecycle


def test_stopped_server_refuses_connections(server_name: ServerName) -> None:
    with serve_app(make_app(), server=server_name) as running:
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((running.host, running.port), timeout=5 * T).close()


async def failing_lifespan(scope: Scope, receive: Receive, send: Send) -> None:
    """An app whose lifespan startup fails, as a failing Starlette ``lifespan`` reports it."""
    assert scope["type"] == "lifespan"
    assert (await receive())["type"] == "lifespan.startup"
    await send({"type": "lifespan.startup.failed", "message": "startup failed"})


def test_failed_startup_raises(server_name: ServerName) -> None:
    with (
        pytest.raises(ServerFailed, match="before it was ready") as excinfo,
        serve_app(failing_lifespan, server=server_name),
    ):
        pass
    # Hypercorn raises LifespanFailureError; Uvicorn calls sys.exit().
    assert excinfo.value.__cause__ is not None


class _Recorder(logging.Handler):
    """Signal the first ERROR record, which the server logs from its own thread."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.event.set()


def test_app_errors_are_logged(server: RunningServer, server_name: ServerName) -> None:
    recorder = _Recorder()
    logger = logging.getLogger(ERROR_LOGGERS[server_name])
    logger.addHandler(recorder)
    try:
        with httpx.Client(base_url=server.http_url, timeout=5 * T) as client:
            assert client.get("/fail").status_code == 500
        assert recorder.event.wait(5 * T)
    finally:
        logger.removeHandler(recorder)
    assert recorder.records[0].exc_info is not None


# Timing, ports, TLS


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, 1.0), ({ENV_VAR: ""}, 1.0), ({ENV_VAR: "2.5"}, 2.5), ({ENV_VAR: " 3 "}, 3.0)],
)
def test_timeout_unit(environ: dict[str, str], expected: float) -> None:
    assert timeout_unit(environ) == expected


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf"])
def test_timeout_unit_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match=ENV_VAR):
        timeout_unit({ENV_VAR: raw})


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 0 < port < 65536


def test_listen_port_is_bindable_below_the_ephemeral_range_and_never_repeated() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [listen_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        assert 20000 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_certificate(tls_files: TlsFiles) -> None:
    cert = x509.load_pem_x509_certificate(tls_files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    found = [str(n) for n in names.get_values_for_type(x509.IPAddress)]
    found += names.get_values_for_type(x509.DNSName)
    assert sorted(found) == sorted(SERVER_NAMES)
    assert stat.S_IMODE(tls_files.key.stat().st_mode) == 0o600


# Redis


def test_redis_ping(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server, redis.Redis.from_url(server.url) as client:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert client.ping() is True
        assert any(READY_MARKER in line for line in server.log)


@pytest.mark.anyio
async def test_redis_ping_async(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            assert await client.ping() is True
        finally:
            await client.aclose()


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill"])
def test_redis_aof_keeps_data(tmp_path: Path, crash: bool) -> None:
    with RedisServer(tmp_path, appendonly=True) as server:
        port, first_pid = server.port, server.pid
        with redis.Redis.from_url(server.url) as client:
            client.set("key", "value")
        if crash:
            server.kill()
            server.start()
        else:
            server.restart()
        assert (server.port, server.directory) == (port, tmp_path)
        assert server.pid != first_pid
        with redis.Redis.from_url(server.url) as client:
            assert client.get("key") == b"value"


def test_redis_without_aof_loses_data(tmp_path: Path) -> None:
    # The counterpart of the test above: proves that test would notice lost data.
    with RedisServer(tmp_path) as server:
        with redis.Redis.from_url(server.url) as client:
            client.set("key", "value")
        server.restart()
        with redis.Redis.from_url(server.url) as client:
            assert client.get("key") is None


def test_redis_stop_reaps_process(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    pid = server.pid
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RedisServerError, match="not running"):
        _ = server.pid
    server.stop()  # idempotent


def test_redis_missing_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerError, match="not found on PATH"):
        RedisServer(tmp_path).start()


def test_redis_startup_failure_reports_log(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "a") as first:
        second = RedisServer(tmp_path / "b")
        second.port = first.port  # taken: Redis exits with a bind error
        with pytest.raises(RedisServerError, match="exited during startup") as excinfo:
            second.start()
    assert str(first.port) in str(excinfo.value)
