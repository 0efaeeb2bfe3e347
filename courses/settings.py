"""The ``[courses]`` table: this bus's domain and key, and each peer bus it links to.

::

    [courses]
    domain = "a.test"                  # this bus's domain: Conversation-Addresses *a.test
    signing_key = "keys/a.test.pem"    # this bus's private key (Ed25519, P-256 or RSA)
    ca = "tls/ca.pem"                  # trust roots for dialling peers over wss://
    max_hops = 4                       # Courses one Command may cross
    queue_max_commands = 100000        # per peer domain
    queue_max_bytes = 67108864         # per peer domain
    max_age = 86400                    # seconds a Command may wait for its Course

    [courses."b.test"]
    urls = ["wss://broker.b.test/course"]  # dialled in turn; none: this side only answers
    public_key = "keys/b.test.pub.pem"      # or jwks = "keys/b.test.jwks.json"
    names = ["chat", "chat\\..*"]          # Command-Names that may cross (regular expressions)
    exchanges = ["1.3.6.1.4.1.99999.1"]     # ``x`` values that may cross; empty: any
    addresses = [".*"]                      # recipients that may cross (expressions)
    routes = ["c.test"]                     # further domains reached through this peer
    http2 = "auto"                          # WebSocket over HTTP/2 (RFC 8441): auto, always, never

Relative paths resolve against the configuration file's directory. Everything is
checked once, at start-up, and a mistake is a :class:`CourseConfigError` naming the
key: a broker never starts half-linked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from courses.credential import SigningKey
from courses.transport import HTTP2_MODES, Http2Mode
from gateway.auth.errors import CredentialConfigError
from gateway.auth.keys import AgentKey, keys_from_agent_table
from gateway.errors import LocalError

__all__ = ["CourseConfigError", "CourseSettings", "PeerSettings"]

#: The ``addresses`` expression that lets any recipient cross (the default).
_ANY: Final = r".*"
#: Command-Names :meth:`PeerSettings.permits` remembers per peer.
_MAX_NAMES_KNOWN: Final = 1024

_DOMAIN: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_SCALARS: Final = frozenset(
    {
        "domain",
        "signing_key",
        "kid",
        "ca",
        "max_hops",
        "queue_max_commands",
        "queue_max_bytes",
        "max_age",
        "dedupe_window",
        "credential_lifetime",
        "window",
        "backoff_min",
        "backoff_max",
        "lookup_max_commands",
    }
)
_PEER_KEYS: Final = frozenset(
    {"urls", "public_key", "jwks", "kid", "names", "exchanges", "addresses", "routes", "http2"}
)


class CourseConfigError(LocalError):
    """The ``[courses]`` table is wrong; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"[courses] {key}: {message}")
        #: The key at fault, such as ``courses."b.test".urls``.
        self.key = key


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """One peer bus: where to dial it, how to know it, and what may cross."""

    #: The peer's domain (the part after ``*`` in its addresses).
    domain: str
    #: Its Course endpoints, dialled in turn; empty: we only answer it.
    urls: tuple[str, ...]
    #: The public keys its credentials and replies are signed with.
    keys: tuple[AgentKey, ...]
    #: Command-Names that may cross, as full-match expressions.
    names: tuple[re.Pattern[str], ...]
    #: ``x`` values that may cross; empty: any (or none).
    exchanges: frozenset[str]
    #: Recipient addresses that may cross, as full-match expressions.
    addresses: tuple[re.Pattern[str], ...]
    #: Further domains whose Commands go through this peer.
    routes: tuple[str, ...]
    #: Whether to dial over HTTP/2 (RFC 8441): ``auto`` (where the server offers
    #: it), ``always`` or ``never`` (courses.transport).
    http2: Http2Mode = "auto"
    #: Command-Names already matched against ``names``: every crossing asks, and a
    #: bus sends few names. Bounded: cleared when it reaches _MAX_NAMES_KNOWN.
    _names_known: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def permits(self, name: str, exchange: str | None, recipients: tuple[str, ...]) -> str | None:
        """Why this Command may not cross to this peer, or None if it may."""
        known = self._names_known
        allowed = known.get(name)
        if allowed is None:
            allowed = any(pattern.fullmatch(name) for pattern in self.names)
            if len(known) >= _MAX_NAMES_KNOWN:
                known.clear()
            known[name] = allowed
        if not allowed:
            return f"Command-Name {name!r} may not cross to {self.domain}"
        if self.exchanges and exchange not in self.exchanges:
            return f"'x' {exchange!r} may not cross to {self.domain}"
        addresses = self.addresses
        if len(addresses) == 1 and addresses[0].pattern == _ANY:
            return None  # the default: any address, no expression to run per recipient
        for address in recipients:
            if not any(pattern.fullmatch(address) for pattern in addresses):
                return f"address {address!r} may not cross to {self.domain}"
        return None


@dataclass(frozen=True, slots=True)
class CourseSettings:
    """This bus's side of every Course."""

    #: This bus's domain.
    domain: str
    #: Its private signing key, PEM.
    signing_key: bytes
    #: The ``kid`` its credentials name, if the peers hold a key set.
    kid: str | None
    #: Trust roots for ``wss://`` peers; None: the system's.
    ca: Path | None
    #: The peers, by domain.
    peers: Mapping[str, PeerSettings]
    #: Courses one Command may cross (the length of ``course.via``).
    max_hops: int = 4
    #: Commands one peer's queue holds while its Course is down.
    queue_max_commands: int = 100_000
    #: Bytes one peer's queue holds.
    queue_max_bytes: int = 64 * 1024 * 1024
    #: Seconds a Command waits for its Course before it expires (fault 2210).
    max_age: float = 86_400.0
    #: Seconds a receiving bus remembers the ``course.id`` values it accepted.
    dedupe_window: float = 86_400.0
    #: Seconds a handshake credential lives.
    credential_lifetime: float = 60.0
    #: Commands sent and not yet acknowledged, per Course.
    window: int = 1024
    #: First reconnection delay, seconds; doubled per failure, with jitter.
    backoff_min: float = 0.1
    #: Longest reconnection delay, seconds.
    backoff_max: float = 30.0
    #: Commands for this bus's addresses waiting at one broker for the routing
    #: plane to say which brokers hold them; one more gets fault 2106.
    lookup_max_commands: int = 10_000

    def course_for(self, domain: str) -> PeerSettings | None:
        """The peer whose Course carries Commands for ``domain``: the peer itself if
        we dial it, else the first we dial that routes it; None if no Course does
        (a peer listed without URLs only dials us, and we send on the Courses we dial)."""
        peer = self.peers.get(domain)
        if peer is not None and peer.urls:
            return peer
        for candidate in self.peers.values():
            if domain in candidate.routes and candidate.urls:
                return candidate
        return None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], *, base_dir: Path) -> CourseSettings:
        """Check and build the settings from the ``[courses]`` table.

        Raises:
            CourseConfigError: a missing, unknown or malformed key.
        """
        peers_tables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
        scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
        unknown = sorted(set(scalars) - _SCALARS)
        if unknown:
            raise CourseConfigError(unknown[0], "unknown setting")
        domain = _domain(scalars.get("domain"), "domain")
        key_path = scalars.get("signing_key")
        if not isinstance(key_path, str):
            raise CourseConfigError("signing_key", "the bus's private key file is required")
        try:
            signing_key = (base_dir / key_path).read_bytes()
        except OSError as exc:
            raise CourseConfigError("signing_key", f"cannot read {key_path}: {exc}") from exc
        ca = scalars.get("ca")
        if ca is not None and not isinstance(ca, str):
            raise CourseConfigError("ca", "a file name")
        numbers: dict[str, Any] = {}
        for name in (
            "max_hops",
            "queue_max_commands",
            "queue_max_bytes",
            "window",
            "lookup_max_commands",
        ):
            if name in scalars:
                numbers[name] = _positive(scalars[name], name, integer=True)
        for name in (
            "max_age",
            "dedupe_window",
            "credential_lifetime",
            "backoff_min",
            "backoff_max",
        ):
            if name in scalars:
                numbers[name] = float(_positive(scalars[name], name, integer=False))
        kid = scalars.get("kid")
        try:
            SigningKey(signing_key, domain=domain)
        except ValueError as exc:
            raise CourseConfigError("signing_key", str(exc)) from exc
        peers = {
            peer_domain: _peer(peer_domain, peer_table, base_dir, own=domain)
            for peer_domain, peer_table in peers_tables.items()
        }
        return cls(
            domain=domain,
            signing_key=signing_key,
            kid=kid if isinstance(kid, str) else None,
            ca=base_dir / ca if ca is not None else None,
            peers=peers,
            **numbers,
        )


def _domain(value: object, key: str) -> str:
    if not isinstance(value, str) or not _DOMAIN.fullmatch(value):
        raise CourseConfigError(key, f"a domain name such as example.org, not {value!r}")
    return value.lower()


def _positive(value: object, key: str, *, integer: bool) -> int | float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and not isinstance(value, int))
        or not value > 0
    ):
        raise CourseConfigError(key, f"a positive {'integer' if integer else 'number'}")
    return value


def _patterns(value: object, key: str, default: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    items = default if value is None else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise CourseConfigError(key, "a list of regular expressions")
    try:
        return tuple(re.compile(item) for item in items)
    except re.error as exc:
        raise CourseConfigError(key, f"not a regular expression: {exc}") from exc


def _peer(domain: str, table: Mapping[str, Any], base_dir: Path, *, own: str) -> PeerSettings:
    prefix = f'"{domain}"'
    domain = _domain(domain, prefix)
    if domain == own:
        raise CourseConfigError(prefix, "a bus needs no Course to itself")
    unknown = sorted(set(table) - _PEER_KEYS)
    if unknown:
        raise CourseConfigError(f"{prefix}.{unknown[0]}", "unknown setting")
    urls = table.get("urls", [])
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise CourseConfigError(f"{prefix}.urls", "a list of wss:// URLs")
    for url in urls:
        if urlsplit(url).scheme not in ("wss", "ws"):
            raise CourseConfigError(f"{prefix}.urls", f"{url!r} is not a wss:// URL")
    key_table = {k: table[k] for k in ("public_key", "jwks", "kid") if k in table}
    try:
        keys = keys_from_agent_table(domain, key_table, base_dir)
    except CredentialConfigError as exc:
        raise CourseConfigError(f"{prefix}.public_key", str(exc)) from exc
    exchanges = table.get("exchanges", [])
    if not isinstance(exchanges, list) or not all(isinstance(x, str) for x in exchanges):
        raise CourseConfigError(f"{prefix}.exchanges", "a list of 'x' values")
    routes = table.get("routes", [])
    if not isinstance(routes, list):
        raise CourseConfigError(f"{prefix}.routes", "a list of domains")
    return PeerSettings(
        domain=domain,
        urls=tuple(urls),
        keys=keys,
        # Nothing crosses unless listed: a new peer carries no Command-Name by accident.
        names=_patterns(table.get("names"), f"{prefix}.names", ()),
        exchanges=frozenset(exchanges),
        addresses=_patterns(table.get("addresses"), f"{prefix}.addresses", (_ANY,)),
        routes=tuple(_domain(r, f"{prefix}.routes") for r in routes),
        http2=_http2(table.get("http2", "auto"), f"{prefix}.http2"),
    )


def _http2(value: object, key: str) -> Http2Mode:
    for mode in HTTP2_MODES:
        if value == mode:
            # "always" with a ws:// URL (the development flag only) is h2c: HTTP/2
            # with prior knowledge, since plain text has no ALPN (courses.transport).
            return mode
    raise CourseConfigError(key, f'"auto", "always" or "never", not {value!r}')
