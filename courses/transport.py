"""Dialling a Course's WebSocket: over HTTP/2 where the peer offers it, else HTTP/1.1.

A peer's ``http2`` setting (courses.settings) chooses:

``auto`` (the default)
    offer ``h2`` by ALPN; a server that picks it and enables extended CONNECT
    (RFC 8441) carries the WebSocket on an HTTP/2 stream (courses.h2), any other
    gets a second connection for the HTTP/1.1 upgrade (websockets' client), and is
    dialled straight over HTTP/1.1 for :data:`REPROBE` seconds after that, so a
    peer without HTTP/2 costs one extra TLS handshake per ten minutes, not one per
    reconnection. A server that takes HTTP/2 and then refuses the Course is not
    asked again over HTTP/1.1: its refusal stands.
``always``
    HTTP/2 or nothing: a server without it fails the attempt (``course.link_failed``).
``never``
    HTTP/1.1 only, as before HTTP/2 was offered.

``ws://`` (the development flag) is HTTP/1.1 under ``auto`` and ``never``: HTTP/2
is chosen by TLS's ALPN, and plain text has none. Under ``always`` it is HTTP/2
with prior knowledge (h2c: the connection starts with HTTP/2's preface), which
Hypercorn answers, so the HTTP/2 Course can be measured without TLS
(``bench/courses.py --h2c``); a server without it fails the attempt.
Either way a message from the answering side is at most ``MAX_MESSAGE`` (1 MiB);
a larger one closes the link (1009) and it is dialled again.
The two paths send the same request headers (the Course credential) and give the
same socket interface (:class:`CourseSocket`), so courses.link does not know which
one it drains into; it only reports it (``course.up``'s ``http2``).
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol
from urllib.parse import urlsplit

from websockets.asyncio.client import connect

from courses.h2 import MAX_MESSAGE, Http2Unavailable, h2_ssl_context, open_h2_websocket

__all__ = ["HTTP2_MODES", "REPROBE", "CourseSocket", "Dialled", "Dialler", "Http2Mode"]

Http2Mode = Literal["auto", "always", "never"]
HTTP2_MODES: Final[tuple[Http2Mode, ...]] = ("auto", "always", "never")
#: Seconds ``auto`` keeps to HTTP/1.1 with a URL whose server did not offer HTTP/2.
REPROBE: Final = 600.0


class CourseSocket(Protocol):
    """What a Course uses of a WebSocket: websockets' connection and courses.h2's both fit."""

    async def send(self, message: bytes, /) -> None: ...

    async def recv(self) -> bytes | str: ...

    def __aiter__(self) -> AsyncIterator[bytes | str]: ...


@dataclass(frozen=True, slots=True)
class Dialled:
    """An open Course socket, and whether it runs on HTTP/2."""

    socket: CourseSocket
    http2: bool


class Dialler:
    """Opens the WebSocket of one peer's Course.

    Args:
        ca: trust roots for ``wss://`` (None: the system's).
        http2: ``auto``, ``always`` or ``never`` (see the module's docstring).
        open_timeout: seconds for connecting and the handshake, per attempt.
    """

    def __init__(self, *, ca: Path | None, http2: Http2Mode, open_timeout: float = 10.0) -> None:
        cafile = str(ca) if ca is not None else None
        self.http2 = http2
        self._open_timeout = open_timeout
        # Two contexts: the HTTP/1.1 one must not offer h2, or a server would pick it.
        self._ssl = ssl.create_default_context(cafile=cafile)
        self._h2_ssl = h2_ssl_context(cafile)
        #: URL -> when (monotonic) its server last did not offer HTTP/2; one entry
        #: per URL of this peer at most.
        self._http1_since: dict[str, float] = {}

    @contextlib.asynccontextmanager
    async def dial(self, url: str, *, headers: Mapping[str, str]) -> AsyncIterator[Dialled]:
        """The WebSocket to ``url``, closed on exit.

        Raises:
            OSError, TimeoutError: no connection.
            websockets.exceptions.WebSocketException: a refused handshake (as
                ``InvalidStatus`` on either HTTP), or no HTTP/2 under ``always``.
        """
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        since = self._http1_since.get(url)
        known_http1 = since is not None and time.monotonic() - since < REPROBE
        if (secure and self.http2 != "never" and not (self.http2 == "auto" and known_http1)) or (
            not secure and self.http2 == "always"
        ):
            host = parts.hostname or ""
            path = parts.path or "/"
            try:
                socket = await open_h2_websocket(
                    host,
                    parts.port or (443 if secure else 80),
                    path=f"{path}?{parts.query}" if parts.query else path,
                    authority=parts.netloc.rpartition("@")[2],
                    headers=list(headers.items()),
                    ssl_context=self._h2_ssl if secure else None,
                    open_timeout=self._open_timeout,
                )
            except Http2Unavailable:
                if self.http2 == "always":
                    raise
                self._http1_since[url] = time.monotonic()
            else:
                self._http1_since.pop(url, None)
                async with socket:
                    yield Dialled(socket, http2=True)
                return
        async with connect(
            url,
            additional_headers=dict(headers),
            ssl=self._ssl if secure else None,
            compression=None,
            # Bounded as over HTTP/2: the answering side sends a greeting and
            # acknowledgements only, and a hostile one must not fill our memory.
            max_size=MAX_MESSAGE,
            open_timeout=self._open_timeout,
        ) as ws:
            yield Dialled(ws, http2=False)
