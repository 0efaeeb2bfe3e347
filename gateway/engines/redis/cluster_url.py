"""``redis+cluster://`` URLs, read without importing the Redis client.

The configuration checks a ``redis_url`` before any engine exists (and a
``memory`` broker never loads redis-py), so the reading lives here, pure;
:mod:`gateway.engines.redis.connection` connects with what it returns. The
format is described there.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Final

__all__ = ["CLUSTER_SCHEMES", "ClusterAddress", "is_cluster_url", "parse_cluster_url"]

#: The URL schemes that name a Redis Cluster rather than one Redis.
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True, slots=True)
class ClusterAddress:
    """A ``redis+cluster://`` URL, read."""

    #: The seed nodes, as given.
    seeds: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urllib.parse.urlsplit(url).scheme in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterAddress:
    """Read a ``redis+cluster://`` URL; see the module docstring.

    Raises:
        ValueError: not a cluster URL, no host, a host without a port or with a
            bad one, or a database other than 0.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a {' or '.join(s + '://' for s in CLUSTER_SCHEMES)} URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, has_password, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if has_password else None
    seeds: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, colon, port = host.strip().rpartition(":")
        if not colon or not name or not port.isascii() or not port.isdigit():
            raise ValueError(f"every cluster node needs host:port, not {host!r}")
        number = int(port)
        if not 0 < number < 65536:
            raise ValueError(f"port {number} is out of range")
        seeds.append((name.strip("[]"), number))
    if parts.path not in ("", "/", "/0"):
        raise ValueError("a Redis Cluster has only database 0")
    return ClusterAddress(tuple(seeds), username, password, parts.scheme == "rediss+cluster")
