"""Broker configuration: one frozen dataclass per concern, secure defaults.

Sources, lowest precedence first: the defaults below, a TOML file
(``--config`` or ``ASBP_CONFIG``), ``ASBP_*`` environment variables, then
command-line flags. Loading lives in ``gateway.config.loading``; this module only
says what can be configured and what each field means.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import asbp

# Imported at run time, not under TYPE_CHECKING: gateway.config.fields reads these
# annotations with typing.get_type_hints. gateway.acl is pure and cheap to import.
from gateway.acl import Acl

__all__ = [
    "ChannelLimits",
    "EngineName",
    "EventLogConfig",
    "EventLogMode",
    "GatewayConfig",
    "LoopName",
    "ManagementConfig",
    "MessagingLimits",
    "MetricsConfig",
    "ResumeMode",
    "RunningServer",
    "ServerName",
    "TlsConfig",
    "TubeLimits",
    "chosen_server",
]

MiB = 1024 * 1024

ServerName = Literal["auto", "hypercorn", "uvicorn"]
#: The server that actually runs: what ``server = "auto"`` resolves to (``chosen_server``).
RunningServer = Literal["hypercorn", "uvicorn"]
EngineName = Literal["memory", "redis"]
#: The event loop setting (``gateway.ops.loops`` resolves ``auto``).
LoopName = Literal["auto", "asyncio", "uvloop"]
EventLogMode = Literal["on", "off"]
BusBalance = Literal["in_flight", "turns"]
ResumeMode = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The certificate the broker serves HTTPS and WSS with."""

    #: PEM certificate chain.
    certfile: Path
    #: PEM private key.
    keyfile: Path


@dataclass(frozen=True, slots=True)
class ChannelLimits:
    """Bounds on what one User-Agent Channel may cost the broker."""

    #: Commands queued for a Channel before its reader counts as too slow
    #: and is disconnected with fault 2105.
    outbox_frames: int = 1024
    #: Bytes queued for a Channel before the same happens.
    outbox_bytes: int = 4 * MiB
    #: Commands with ``u`` awaiting a Respondent's answer, per Channel.
    max_in_flight: int = 256
    #: Seconds a long-poll request waits for a Command before it returns empty.
    long_poll_timeout: float = 25.0
    #: Commands returned by one long-poll response at most.
    long_poll_max_frames: int = 256
    #: Seconds without a request after which a stateless HTTP Channel expires.
    http_idle_timeout: float = 120.0
    #: Seconds a Command routed to a Channel stays in its bus-wide log (the
    #: routing plane's Channel log: an HTTP Channel's mailbox, and what a
    #: WebSocket Channel that reconnects resumes) until its client has it; older
    #: unacknowledged Commands are dropped and a resume reports the gap.
    log_max_age: float = 600.0
    #: Commands a Channel's log keeps at most; past it the oldest go first.
    log_max_frames: int = 10_000
    #: Bytes of Commands a Channel's log keeps at most (the newest is always kept).
    log_max_bytes: int = 16 * MiB
    #: Whether a WebSocket Channel that drops can resume (docs/protocol.md,
    #: "Resuming a Channel"): every frame sent to it is also appended to its
    #: Channel log. ``auto``: on when the routing plane spans brokers (the
    #: ``redis`` engine), off on a lone broker; ``on``: also on a lone broker
    #: (resume on the same broker); ``off``: never.
    resume: ResumeMode = "auto"
    #: Seconds an HTTP request's body has, from its first byte to its last, on
    #: Hypercorn and Uvicorn alike. A body that stalls or arrives too slowly (a
    #: ``Content-Length`` larger than what is sent, chunks that never end) gets
    #: ``408`` with fault 1201 and its connection is closed, so it cannot hold a
    #: connection and a request slot open.
    http_read_timeout: float = 10.0
    #: Channels (WebSocket and HTTP together) one client address (an IPv6 /64)
    #: may hold open at once; one more gets fault 2108 (a WebSocket Channel is
    #: then closed with 1008, an HTTP POST gets ``429``). 0 turns the limit off.
    #: Behind a reverse proxy every client has the proxy's address: raise it.
    max_per_address: int = 1000
    #: HTTP Channels one client address may open per second, sustained and in
    #: a burst (a token bucket); past it ``429`` with ``Retry-After`` and fault
    #: 2108. 0 turns the limit off.
    http_opens_per_second: int = 20
    #: WebSocket handshakes (to ``/asbp`` and ``/tube``) the broker serves at
    #: once, from the parsed upgrade request to its accept or refusal; one more is
    #: answered at once with ``503``, ``Retry-After`` and fault 2115, before any
    #: Channel is made, and so is a POST that would open an HTTP Channel
    #: meanwhile. Past its capacity a broker that took them all served each after
    #: its client had given up. 0 turns the bound off.
    max_handshakes: int = 500
    #: Seconds a publisher (Channel or Tube) is held back by flow control at most
    #: while a destination's outbox is over half full (WebSocket: its next message
    #: is not read; HTTP: ``429`` with fault 2109). A destination that has not
    #: drained below a quarter by then counts as stopped: nobody is held back for
    #: it any more, so it fills and is cut off with 2105 as before.
    flow_stall_timeout: float = 1.0


@dataclass(frozen=True, slots=True)
class TubeLimits:
    """Bounds on what one Application-Agent Tube may cost the broker."""

    #: Commands queued for a Tube before its agent counts as too slow.
    outbox_frames: int = 8192
    #: Bytes queued for a Tube before the same happens.
    outbox_bytes: int = 32 * MiB
    #: Seconds a Respondent has to answer a Command carrying ``u`` before the
    #: User-Agent gets fault 2103.
    respondent_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class MessagingLimits:
    """Bounds on topics, queues and subscriptions (docs/protocol.md, "Topics and queues")."""

    #: Distinct queues and virtual queues in the engine; a publish or subscribe that
    #: would create one more gets fault 2003.
    max_queues: int = 10_000
    #: Seconds a consumer has to acknowledge a queue message before it is delivered
    #: again, to any consumer.
    ack_timeout: float = 30.0
    #: Seconds a queue message lives when its publisher gave no ``ttl``.
    default_ttl: float = 7 * 24 * 3600.0
    #: Deliveries after which an unacknowledged queue message is discarded (a poison
    #: message).
    max_deliveries: int = 20
    #: Messages one queue holds (leased and delayed ones included); a publish past
    #: it gets fault 2006, and a full virtual queue drops topic copies.
    max_queue_depth: int = 100_000
    #: Distinct subscriptions (topic names, topic patterns, queues and virtual queues)
    #: held at this broker; one more gets fault 2004.
    max_subscriptions: int = 10_000
    #: Queue messages one subscriber holds unacknowledged at most; also the most one
    #: ``asbp.poll`` takes.
    prefetch: int = 16
    #: Messaging Commands (publish, subscribe, poll, ...) of one Channel or Tube that
    #: wait for the engine at once; one more gets fault 2106.
    max_pending: int = 256
    #: Seconds an ``asbp.poll`` may wait for a message at most.
    max_poll_wait: float = 25.0
    #: Seconds between the broker's periodic publications of its consumer counts on
    #: the ``/system/stats/`` topics (they are also published on every change).
    system_topic_interval: float = 30.0


@dataclass(frozen=True, slots=True)
class EventLogConfig:
    """The event log: one record per routed Command (docs/spark.md, "The event log")."""

    #: ``on`` records every Command the broker routes, in the engine's store: rotating
    #: NDJSON files in ``data_dir/events/`` with ``memory``, the capped Redis Stream
    #: ``asbp:events`` with ``redis``. ``off`` records nothing.
    mode: EventLogMode = "on"
    #: Events waiting in memory to be written, at most; past it new events are dropped
    #: and counted (a warning is logged), so routing never waits for the log.
    buffer: int = 65_536
    #: Bytes of one NDJSON file (``memory`` engine) before the log starts the next.
    file_bytes: int = 64 * MiB
    #: NDJSON files kept (``memory`` engine); past it the oldest is deleted.
    files: int = 8
    #: Entries the Redis Stream keeps (``redis`` engine), approximately: older ones are
    #: trimmed as new ones are added (``XADD MAXLEN ~``).
    max_events: int = 1_000_000


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus metrics at ``/metrics`` (docs/operations.md, "Metrics")."""

    #: Serve ``/metrics`` and count Commands by name. Off, the router counts only
    #: what costs nothing (Channels and Tubes opened and closed, slow readers).
    enabled: bool = True
    #: Command-Names with a label of their own; later names are counted as
    #: ``other``, so clients cannot grow the scrape without bound.
    command_names: int = 100
    #: Queues whose depth gets a line of its own, the deepest first; every queue
    #: is in the total, so 100,000 queues do not make a 100,000-line scrape.
    top_queues: int = 20


@dataclass(frozen=True, slots=True)
class ManagementConfig:
    """The management API under ``/api/v1`` (docs/operations.md, "Management API").

    With neither ``token_file`` nor ``jwks_url``/``jwks_file`` set, the API answers
    only while the broker listens on a loopback address, and only to loopback peers;
    otherwise every call needs a bearer token.
    """

    #: Serve the management API.
    enabled: bool = True
    #: A file holding the static admin token (one line). A bearer token equal to it
    #: may read and write.
    token_file: str | None = None
    #: The OAuth 2 issuer's JWKS URL: bearer JWT access tokens signed by one of its
    #: keys are accepted (fetched on first use, again for an unknown ``kid``).
    jwks_url: str | None = None
    #: The issuer's keys as a JWKS file, instead of ``jwks_url``.
    jwks_file: str | None = None
    #: The ``iss`` every JWT access token must carry (required with a JWKS).
    issuer: str | None = None
    #: The ``aud`` every JWT access token must carry (required with a JWKS).
    audience: str | None = None
    #: The scope a JWT needs to read (``scope`` or ``scp`` claim).
    read_scope: str = "asbp:read"
    #: The scope a JWT needs to change anything.
    write_scope: str = "asbp:write"
    #: Seconds between two fetches of ``jwks_url`` for tokens naming a ``kid`` the
    #: cached keys lack (the issuer rotated its keys), at least: a flood of tokens
    #: with made-up ``kid`` values cannot make the broker hammer the issuer.
    jwks_refetch_interval: float = 60.0
    #: The console's sign-in: the OpenID Connect provider's discovery document
    #: (``https://sso.example.com/realms/ops/.well-known/openid-configuration``).
    #: With ``oidc_client_id``, ``/console/`` offers "Sign in" through the provider
    #: (authorisation code with PKCE); its access tokens must pass the JWT checks
    #: above (``jwks_url``, ``issuer``, ``audience``, scopes).
    oidc_discovery_url: str | None = None
    #: The console's client identifier at the OpenID Connect provider.
    oidc_client_id: str | None = None
    #: A file holding the console's client secret (one line), for a confidential
    #: client; none for a public client, which PKCE alone protects.
    oidc_client_secret_file: str | None = None
    #: The scopes the console asks the provider for.
    oidc_scope: str = "openid asbp:read asbp:write"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything a broker needs to start."""

    #: Address to listen on. Loopback by default: exposing a broker is a choice.
    host: str = "127.0.0.1"
    #: Port to listen on; 0 picks a free one.
    port: int = 8080
    #: The ASGI server: ``auto`` runs Hypercorn when ``tls`` is set (HTTP/2 by
    #: ALPN) and Uvicorn otherwise (HTTP/1.1 and WebSocket, the faster WebSocket
    #: path); ``hypercorn`` (HTTP/1, HTTP/2 also in cleartext, TLS, WebSocket) or
    #: ``uvicorn`` pins one.
    server: ServerName = "auto"
    #: The event loop the broker runs on: ``auto`` takes uvloop when it is
    #: installed (a dependency on CPython outside Windows: each wake-up of the
    #: broker costs less CPU on it) and asyncio's own loop otherwise;
    #: ``asyncio`` or ``uvloop`` pins one (``uvloop`` without uvloop installed
    #: is a configuration error). The ``listening`` log line names the loop.
    loop: LoopName = "auto"
    #: TLS for the listening port; None serves plain HTTP.
    tls: TlsConfig | None = None
    #: Accept permessage-deflate (RFC 7692) when a WebSocket client offers it, as
    #: browsers always do. Off by default, as Centrifugo and Socket.IO have it:
    #: ASBP Commands are short, a compressor per connection costs tens of KiB and
    #: CPU on every frame, and a compressed connection leaves the fast frame path
    #: (gateway.transports.coalescing, gateway.transports.hypercorn_ws: on both
    #: servers). Worth it for large text payloads on slow links.
    websocket_compression: bool = False
    #: The Broker-Identifier ``b``; None loads it from ``data_dir`` or creates
    #: one there, so it stays stable across restarts.
    broker_id: str | None = None
    #: Where the broker keeps its identity and the memory engine's files.
    data_dir: Path = Path(".asbp")
    #: The topic and queue engine.
    engine: EngineName = "memory"
    #: Redis for the ``redis`` engine (and the routing plane and event log that
    #: follow it): ``redis://host:port/db``, ``rediss://`` (TLS), ``unix://``; or a
    #: Redis Cluster, ``redis+cluster://host:port,host:port`` (``rediss+cluster://``
    #: for TLS): any reachable node gives the client the slot map (docs/kubernetes.md).
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Seconds within which a broker that dies drops out of the bus-wide routing
    #: plane (``redis`` engine: the plane follows the engine): its Channels and
    #: Respondents stop being found, and Commands it owed get fault 2102.
    bus_lease: float = 10.0
    #: How a Command for a Respondent on other brokers picks one: ``in_flight``,
    #: the broker with the fewest Commands in flight for the name (each broker
    #: reports its count every second; each Command forwarded to it counts at
    #: once), or ``turns``, each broker serving it in turn.
    bus_balance: BusBalance = "in_flight"
    #: Seconds a broker stopping on a bus (SIGTERM: a rolling restart, a
    #: scale-down) gives the Commands in flight to its Respondents to be answered,
    #: after it left the directory for new work and before it closes its Tubes
    #: (docs/kubernetes.md, "Rolling updates"). Its WebSocket Channels are then
    #: told to resume at another broker (close 1012, fault 2114). Inside the stop
    #: budget and the pods' ``terminationGracePeriodSeconds``.
    drain_timeout: float = 5.0
    #: Codec limits for every inbound frame.
    limits: asbp.Limits = asbp.DEFAULT_LIMITS
    #: Per-Channel bounds.
    channels: ChannelLimits = field(default_factory=ChannelLimits)
    #: Per-Tube bounds.
    tubes: TubeLimits = field(default_factory=TubeLimits)
    #: Topics, queues and subscriptions.
    messaging: MessagingLimits = field(default_factory=MessagingLimits)
    #: The log of routed Commands.
    event_log: EventLogConfig = field(default_factory=EventLogConfig)
    #: The Prometheus metrics.
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: The management API.
    management: ManagementConfig = field(default_factory=ManagementConfig)
    #: The ``aud`` every agent credential must carry.
    audience: str = "asbp-broker"
    #: Application-Agent identities and their public keys, as the ``[agents]``
    #: table of the TOML file (see ``gateway.auth.credentials``).
    agents: Mapping[str, Any] = field(default_factory=dict)
    #: Directory that relative key paths in ``agents`` are resolved against.
    agents_base_dir: Path = Path(".")
    #: Development only: accept Tubes without TLS when listening on loopback (and
    #: Courses without TLS between loopback addresses, docs/courses.md).
    insecure_dev_tubes: bool = False
    #: This bus's domain, signing key and its Courses to other buses, as the
    #: ``[courses]`` table of the TOML file (see docs/courses.md); empty: no Courses.
    #: Relative paths resolve against ``agents_base_dir`` (the file's directory).
    courses: Mapping[str, Any] = field(default_factory=dict)
    #: Serve the demo page (the TypeScript client talking to the example agent) at
    #: ``/``; ``asbp demo`` turns it on.
    demo_page: bool = False
    #: Web origins (``https://app.example.org``, separated by spaces or commas) whose
    #: pages may use ``/asbp``: HTTP Channels (CORS) and WebSocket Channels (the
    #: ``Origin`` check). The broker's own origin is always allowed and clients that
    #: send no ``Origin`` (not browsers) are not affected; ``*`` allows every origin.
    #: Unset by default: no other site's page may use the broker.
    cors_origins: str | None = None
    #: The Authenticate-Command (§7.3.1): a User-Agent sends it to sign a
    #: Subject in; the broker mints ``s`` and forwards it to the agents that
    #: serve it. A bare Command-Name outside ``asbp.``; only agents whose
    #: ``serves`` names it receive it (docs/security.md). Unset: Subjects are off.
    authenticate_command: str | None = None
    #: Failed Tube handshakes one client address (an IPv6 /64) may make per
    #: minute; past that its handshakes get HTTP 429 until the budget refills.
    failed_handshakes_per_minute: int = 10
    #: The access-control lists from the ``[security]`` table (see docs/acl.md);
    #: None allows everything. Only the TOML file sets it.
    acl: Acl | None = None
    #: Log lines as JSON objects (``json``) or as text for people (``text``).
    log_format: Literal["json", "text"] = "json"
    #: Logging level name.
    log_level: str = "info"


def chosen_server(config: GatewayConfig) -> RunningServer:
    """The server ``config`` runs on: ``server`` itself, or what ``auto`` resolves to.

    ``auto`` takes Hypercorn only where its extra features serve a client: with TLS,
    browsers and HTTP clients negotiate HTTP/2 by ALPN. Without TLS no browser speaks
    HTTP/2 (h2c is for other servers and pinned clients), so a broker with neither runs
    on Uvicorn, whose WebSocket path costs about half of Hypercorn's per message
    (bench/roundtrip.py; docs/operations.md, "Which server runs").
    """
    if config.server != "auto":
        return config.server
    return "hypercorn" if config.tls is not None else "uvicorn"
