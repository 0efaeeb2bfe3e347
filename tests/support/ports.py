"""Free loopback ports, for servers that must be told a port number up front.

Prefer binding port 0 and handing over the socket (as :mod:`tests.support.servers` does):
between a function here returning and the other process binding, someone else may take
the port. ``redis-server``, RabbitMQ and the Erlang VM cannot be given a socket, so they
live with that window; :func:`listen_port` makes it as narrow as it can be.
"""

from __future__ import annotations

import random
import socket
import threading
from typing import Final

__all__ = ["free_port", "listen_port"]

#: The lowest port :func:`listen_port` picks, and how many random ones it tries.
_LOWEST_PORT: Final = 20000
_CANDIDATES: Final = 400

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (one the kernel picked,
    so from its ephemeral range: for a server that binds it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def listen_port(host: str = "0.0.0.0") -> int:
    """Return a port free on ``host`` now, below the kernel's ephemeral range, and never
    the same one twice in this process.

    For servers that bind seconds after the port is chosen, or bind it again when
    restarted (a Redis node keeps its port and its cluster-bus port across a restart: the
    cluster's configuration names them). An ephemeral port found free is soon the local
    end of some outgoing connection on a busy machine (the suite opens thousands a
    minute), and the server then fails with "Address already in use": CI lost a run to a
    Redis Cluster node whose bus port had been taken so. The kernel never hands ports
    below its range to outgoing connections, and this process never hands one out twice,
    so only another listener of another process can still take one.
    """
    low = _ephemeral_low()
    with _lock:
        for port in random.sample(range(_LOWEST_PORT, low), _CANDIDATES):
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port between {_LOWEST_PORT} and {low}")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
