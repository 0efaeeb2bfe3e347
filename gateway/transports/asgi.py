"""Small ASGI helpers shared by the transports."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["Receive", "Scope", "Send", "header", "is_loopback", "remote_address"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` in lowercase)."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def remote_address(scope: Scope) -> str:
    """``host:port`` of the peer, or "" when the server does not say."""
    client = scope.get("client")
    if not client:
        return ""
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def is_loopback(scope: Scope) -> bool:
    """Whether the peer connected over loopback."""
    client = scope.get("client")
    if not client:
        return False
    host = str(client[0])
    return host == "::1" or host.startswith("127.") or host == "localhost"
