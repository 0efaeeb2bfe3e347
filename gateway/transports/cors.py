"""Which web pages may use a broker's User-Agent endpoints: CORS and the WebSocket Origin.

A browser sends ``Origin`` with every cross-origin request and every WebSocket
handshake. The broker serves a page of its own origin (the demo's) and the
origins in ``cors_origins``; none by default, so a page elsewhere
cannot drive a user's browser into the broker (secure by default):

* ``OPTIONS /asbp`` (the preflight a ``POST`` with ``Content-Type:
  application/asbp`` causes) is answered ``204`` with the ``Access-Control-*``
  headers for an allowed origin, ``403`` for another.
* ``POST`` and ``GET /asbp`` from an allowed origin carry
  ``Access-Control-Allow-Origin`` and ``Access-Control-Allow-Credentials``
  (the Channel secret's cookie is a credential), and expose ``ASBP-Last-Seq``, ``ASBP-Lost``
  and ``ASBP-Secret``; a request may carry ``ASBP-Secret``; from any
  other origin they are refused with ``403`` and fault 3201 before anything
  is read. The browser would hide the answer anyway, but a ``text/plain``
  POST needs no preflight: refusing it is what keeps a foreign page from
  sending Commands at all.
* A WebSocket handshake to ``/asbp`` with a foreign ``Origin`` is refused the
  same way: browsers apply no CORS to WebSockets, so the broker must.

Requests without ``Origin`` (curl, websocat, the SDKs) are not browsers' and
pass. "Same origin" is the ``Origin``'s host and port equal to the request's
``Host``, whatever the scheme.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Final
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

import asbp
from asbp import FaultCode
from asbp.fault_commands import fault_command

__all__ = ["ANY_ORIGIN", "allowed_origins", "is_allowed", "preflight", "with_cors"]

#: In ``cors_origins``: every origin (an explicit choice, never the default).
ANY_ORIGIN: Final = "*"
#: How long a browser may keep a preflight's answer, in seconds.
_MAX_AGE: Final = "600"


def allowed_origins(setting: str | None) -> frozenset[str]:
    """The origins of ``cors_origins``: separated by spaces or commas, without a final "/"."""
    if setting is None:
        return frozenset()
    return frozenset(o.rstrip("/") for o in setting.replace(",", " ").split())


def is_allowed(origin: str | None, host: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request with ``Origin: origin`` and ``Host: host`` may be served."""
    if origin is None:
        return True
    allowed = frozenset(allowed)
    if ANY_ORIGIN in allowed or origin in allowed:
        return True
    netloc = urlsplit(origin).netloc
    return bool(netloc) and host is not None and netloc.lower() == host.lower()


def _origins(request: Request) -> frozenset[str]:
    return allowed_origins(request.state.broker.config.cors_origins)


def _refused(origin: str) -> Response:
    frame = asbp.encode(
        fault_command(
            FaultCode.ACCESS_DENIED,
            f"origin {origin} is not allowed here (cors_origins)",
        )
    )
    return Response(frame, status_code=403, media_type="application/asbp")


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "access-control-allow-origin": origin,
        "access-control-expose-headers": "ASBP-Last-Seq, ASBP-Secret, ASBP-Lost",
        "access-control-allow-credentials": "true",
        "vary": "Origin",
    }


async def preflight(request: Request) -> Response:
    """``OPTIONS /asbp``: the methods, and for an allowed origin the CORS preflight answer."""
    origin = request.headers.get("origin")
    if origin is None:
        return Response(status_code=204, headers={"allow": "GET, POST, OPTIONS"})
    if not is_allowed(origin, request.headers.get("host"), _origins(request)):
        return _refused(origin)
    return Response(
        status_code=204,
        headers={
            **_cors_headers(origin),
            "allow": "GET, POST, OPTIONS",
            "access-control-allow-methods": "GET, POST",
            "access-control-allow-headers": "content-type, asbp-secret",
            "access-control-max-age": _MAX_AGE,
        },
    )


def with_cors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``endpoint`` refused to foreign origins, and answering allowed ones with CORS headers."""

    async def guarded(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is None:
            return await endpoint(request)
        if not is_allowed(origin, request.headers.get("host"), _origins(request)):
            return _refused(origin)
        response = await endpoint(request)
        response.headers.update(_cors_headers(origin))
        return response

    return guarded
