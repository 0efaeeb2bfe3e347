"""The web console at ``/console``: static files served by the broker (no CDN),
which use the management API (gateway.api) and ``/metrics`` from the browser."""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["STATIC"]

#: The console's files: index.html, console.js, console.css.
STATIC: Final = Path(__file__).resolve().parent / "static"
