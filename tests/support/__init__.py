"""Shared test support: real servers, a private Redis, throwaway TLS, and the timeout unit.

End-to-end tests run against real processes and sockets, never mocks, and wait on events
with deadlines in units of :data:`T`, never on sleeps.
"""

from __future__ import annotations

from .ports import free_port, listen_port
from .redis import RedisServer, RedisServerError
from .servers import (
    RunningServer,
    ServerFailed,
    ServerName,
    UvicornWebSocket,
    serve_app,
    serve_app_async,
)
from .timing import T
from .tls import TlsFiles, client_ssl_context, generate_tls_files

__all__ = [
    "RedisServer",
    "RedisServerError",
    "RunningServer",
    "ServerFailed",
    "ServerName",
    "T",
    "TlsFiles",
    "UvicornWebSocket",
    "client_ssl_context",
    "free_port",
    "generate_tls_files",
    "listen_port",
    "serve_app",
    "serve_app_async",
]
