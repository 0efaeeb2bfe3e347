"""Following the brokers: one Tube URL per address a DNS name resolves to.

Theory of operation
-------------------
On Kubernetes the brokers are the pods behind the headless Service
``asbp-broker-peers``: its name resolves to one address per ready broker, and
the set changes as the HPA scales out and in and as rollouts replace pods. An
Application-Agent that should hold a Tube to every broker (groups, Subjects and
agent-to-agent Commands need a Tube at the User-Agent's own broker) therefore
follows the name rather than a fixed URL list.

:class:`BrokerDiscovery` holds the URL template (``wss://asbp-broker-peers:8443/tube``)
and a resolver. Each :meth:`~BrokerDiscovery.resolve` asks the resolver for the
host's addresses and returns one URL per address, with the host replaced by
the address and the port and path kept (a headless Service's pods all listen on
the same port). The agent (:class:`agents.agent.ApplicationAgent`) calls it every
``interval`` seconds, opens a Tube to each new URL and lets go of each URL that
is gone; TLS still verifies the certificate against the name in the template
(``server_hostname``), so the brokers' certificate names the Service, not pods.

A failed resolution (the name is unknown for a moment, DNS is down) changes
nothing: the agent keeps the Tubes it has and tries again at the next interval.
An empty answer does not close every Tube either: an agent is never left with
no broker because of one bad answer.

Resolvers: :func:`resolve_dns` (the system's resolver, ``getaddrinfo``), the
default; :class:`HostsFileResolver` reads a hosts file (``/etc/hosts`` format)
on every call, for deployments without DNS for the brokers, and for tests,
which can rewrite the file as brokers join and leave.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

__all__ = ["BrokerDiscovery", "HostsFileResolver", "Resolver", "resolve_dns"]

#: ``resolver(host)``: the host's addresses (any order, duplicates allowed).
Resolver = Callable[[str], Awaitable[Sequence[str]]]


async def resolve_dns(host: str) -> list[str]:
    """Every IPv4 and IPv6 address the system resolver gives for ``host``.

    Raises:
        OSError: the name does not resolve (``socket.gaierror``).
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class HostsFileResolver:
    """Resolves names from a hosts file (``address name [name...]`` lines, ``#`` comments).

    The file is read on every call, so that rewriting it changes the answer.

    Args:
        path: the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    async def __call__(self, host: str) -> list[str]:
        """The addresses listed for ``host``.

        Raises:
            OSError: the file cannot be read, or does not list ``host``.
        """
        text = await asyncio.to_thread(self.path.read_text)
        found = []
        for line in text.splitlines():
            fields = line.partition("#")[0].split()
            if len(fields) >= 2 and host in fields[1:]:
                found.append(fields[0])
        if not found:
            raise OSError(f"{host!r} is not in {self.path}")
        return found


class BrokerDiscovery:
    """The brokers behind one name, as Tube URLs; see the module docstring.

    Args:
        url: the template, e.g. ``wss://asbp-broker-peers.asbp.svc:8443/tube``;
            its host is the name to resolve.
        interval: seconds between resolutions.
        resolver: how the name is resolved (default: the system's DNS).

    Raises:
        ValueError: no host in ``url``, an address as its host (nothing to
            resolve), or a non-positive ``interval``.
    """

    def __init__(
        self, url: str, *, interval: float = 10.0, resolver: Resolver = resolve_dns
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        if not host:
            raise ValueError(f"no host to resolve in {url!r}")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            raise ValueError(f"{url!r} names an address, not a name to follow")
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.url = url
        self.host = host
        self.interval = interval
        self._parts = parts
        self._resolver = resolver

    async def resolve(self) -> list[str]:
        """One Tube URL per distinct address, sorted.

        Raises:
            OSError: the resolver failed.
        """
        addresses = sorted(set(await self._resolver(self.host)))
        return [self._url_for(address) for address in addresses]

    def _url_for(self, address: str) -> str:
        netloc = f"[{address}]" if ":" in address else address
        if self._parts.port is not None:
            netloc += f":{self._parts.port}"
        return urllib.parse.urlunsplit(self._parts._replace(netloc=netloc))
