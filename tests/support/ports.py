"""Free loopback ports, for servers that must be told a port number up front.

Prefer binding port 0 and handing over the socket (as :mod:`tests.support.servers` does):
between :func:`free_port` returning and the other process binding, someone else may take
the port. ``redis-server`` cannot be given a socket, so it has to live with that window.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
