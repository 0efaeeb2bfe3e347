"""The demo page ``asbp demo`` serves at ``/``: static files, shipped in the package.

``index.html`` and ``demo.js`` are written by hand; ``asbp.min.js`` is the
TypeScript client (agents/js) bundled by its build, kept here so that an
installed package serves the page with no Node at hand.
tests/browser/test_demo_page.py fails when the copy differs from a fresh
build (copy it again: ``cp agents/js/dist/asbp.min.js gateway/ops/demo_page/``).
Nothing is fetched from a CDN: the page works offline.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["FILES", "routes"]

#: The page's files and their media types.
FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "demo.js": "text/javascript; charset=utf-8",
    "asbp.min.js": "text/javascript; charset=utf-8",
}


def _read(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def _file(name: str) -> Route:
    body = _read(name)
    media_type = FILES[name]

    async def serve(request: Request) -> Response:
        # The page asks the broker for nothing else; keep it from being framed or
        # from loading anything foreign.
        return Response(
            body,
            media_type=media_type,
            headers={
                "cache-control": "no-cache",
                "x-content-type-options": "nosniff",
                "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                "connect-src 'self' http: https: ws: wss:; "
                "frame-ancestors 'none'",
            },
        )

    return Route("/" if name == "index.html" else f"/{name}", serve, methods=["GET"])


def routes() -> list[Route]:
    """``/`` (the page) and its scripts."""
    return [_file(name) for name in FILES]
