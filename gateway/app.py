"""The ASGI application: routes, and the Broker built in the lifespan.

One port serves everything:

==========================  =============================================
``GET /healthz``            liveness: the process answers
``GET /readyz``             readiness: the Broker is started and its engine answers (503 otherwise)
``ws(s)://…/asbp``          a User-Agent Channel over WebSocket
``POST /asbp``              a stateless HTTP Channel: send one Command
``GET /asbp?i=…``           a stateless HTTP Channel: long-poll
``wss://…/tube``            an Application-Agent Tube (TLS + credential)
``GET /metrics``            Prometheus metrics (``[metrics] enabled``)
``/api/v1/…``               the management API (``[management]``), described by
                            ``GET /api/v1/openapi.json``
``GET /console/``           the web console (static files; it calls the API)
==========================  =============================================

The Broker is built in the lifespan, inside the serving event loop, and
reaches handlers through the lifespan state (``scope["state"]``): no
module-level globals, so several apps can run side by side in one process.
The state also holds the :class:`~gateway.auth.throttle.HandshakeThrottle` that
counts failed Tube handshakes per client address, and the
:class:`~gateway.transports.handshakes.HandshakeBound` on the handshakes served at
once (the servers' protocols refuse past it, before the application runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from asbp import AsbpError

# The composition root is the one place gateway/ reaches into courses/
# (docs/architecture.md); at run time only when [courses] is set, so a broker
# without Courses does not pay for importing them (Redis, the JWT signer).
if TYPE_CHECKING:
    from courses.service import Courses
    from courses.settings import CourseSettings
from gateway.acl import AccessContext, DestinationType, Privilege
from gateway.api.routes import api_routes
from gateway.auth.credentials import AgentCredentials
from gateway.auth.throttle import HandshakeThrottle
from gateway.broker import Broker
from gateway.broker_id import broker_identity
from gateway.config.model import GatewayConfig
from gateway.connections.resume import ChannelResume
from gateway.console import STATIC
from gateway.console.oidc import ConsoleSignIn, auth_route
from gateway.ops import demo_page
from gateway.routing.http_bus import HttpBus
from gateway.transports import cors, http, websocket
from gateway.transports.handshakes import STATE_KEY as HANDSHAKES
from gateway.transports.handshakes import HandshakeBound

__all__ = ["create_app"]


def _credentials(config: GatewayConfig) -> AgentCredentials | None:
    if not config.agents:
        return None
    return AgentCredentials.from_config(
        {"audience": config.audience, "agents": config.agents}, base_dir=config.agents_base_dir
    )


class _ASGIEndpoint:
    """Marks a plain ASGI function as such for Starlette's WebSocketRoute,
    which would otherwise wrap a function as ``func(websocket)``."""

    __slots__ = ("_app",)

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # The endpoint's own coroutine, not one more around it: each suspended
        # coroutine is held for the life of its WebSocket (bench/soak.py).
        return self._app(scope, receive, send)


#: What the broker's WebSocket endpoints are: ASGI functions (coroutines).
WebSocketEndpoint = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]


class _BrokerApp(Starlette):
    """Starlette, with the broker's WebSocket endpoints (``/asbp``, ``/tube``) called
    directly instead of through its middleware and router.

    A WebSocket lives for as long as its Channel or Tube, and with it every
    coroutine suspended between the server and the endpoint: Starlette's error
    and exception middleware, its router and route, and their closures held
    about 2.5 KiB per idle Channel, a tenth of all the broker keeps for one
    (bench/soak.py). For a WebSocket they add nothing the endpoints need: no
    exception handlers apply to them, and an endpoint that raises is closed by
    the server (1011) either way. The routes stay in :attr:`routes` as well, so
    the app still describes itself whole; every other request goes through
    Starlette as before.
    """

    def __init__(self, *, websockets: Mapping[str, WebSocketEndpoint], **options: Any) -> None:
        super().__init__(**options)
        self._websockets = dict(websockets)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A coroutine function, not a function returning the endpoint's coroutine:
        # Uvicorn tells ASGI 3 from ASGI 2 by that.
        if scope["type"] == "websocket":
            endpoint = self._websockets.get(_route_path(scope))
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path below ``root_path``, as Starlette's router matches it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


#: Seconds ``/readyz`` waits for the engine to answer before it says not ready.
ENGINE_PING_TIMEOUT: Final = 1.0


async def _readyz(request: Request) -> Response:
    broker: Broker = request.state.broker
    engine = broker.ready and await _engine_answers(broker)
    ready = broker.ready and engine
    body = {
        "ready": ready,
        "engine": engine,
        "broker": broker.broker_id,
        "channels": len(broker.channels),
        "tubes": len(broker.respondents.tubes()),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def _engine_answers(broker: Broker) -> bool:
    """Whether the engine answers a ping in time: a broker whose Redis is gone (or
    stopped) is taken out of a Service's endpoints, and back once it answers."""
    try:
        async with asyncio.timeout(ENGINE_PING_TIMEOUT):
            await broker.engine.ping()
    except (TimeoutError, AsbpError):
        return False
    return True


async def _metrics(request: Request) -> Response:
    # Imported here: prometheus_client loads only where metrics are served.
    from gateway.metrics.collector import CONTENT_TYPE_LATEST, render

    throttle: HandshakeThrottle = request.state.throttle
    bound: HandshakeBound = getattr(request.state, HANDSHAKES)
    body = await render(
        request.state.broker,
        throttled=throttle.refused,
        busy=bound.refused,
        abandoned=bound.abandoned,
    )
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _may_cross(broker: Broker, access: AccessContext, domain: str) -> bool:
    """The ACL's ``COURSE`` rows (docs/acl.md), read at each call: it may be reloaded."""
    acl = broker.router.acl
    if acl is None:
        return True
    return acl.check(access, DestinationType.COURSE, domain, Privilege.WRITE).allowed


async def _start_courses(
    config: GatewayConfig, settings: CourseSettings | None, broker: Broker
) -> Courses | None:
    """This bus's Courses (docs/courses.md), started; None without a ``[courses]`` table."""
    if settings is None:
        return None
    from courses.service import Courses

    router = broker.router
    auth = router.auth
    courses = Courses(
        settings,
        engine=broker.engine,
        replies=router.replies,
        subjects=auth.subjects if auth is not None else None,
        plane=broker.plane if broker.plane.spans_brokers else None,
        may_cross=lambda access, domain: _may_cross(broker, access, domain),
        allow_plain=config.insecure_dev_tubes,
        redis_url=config.redis_url if config.engine == "redis" else None,
        log=broker.log,
    )
    await courses.start()
    router.courses = courses
    broker.courses = courses
    return courses


def create_app(config: GatewayConfig, *, log: logging.Logger | None = None) -> Starlette:
    """Build the broker's ASGI application for ``config``.

    Raises:
        CredentialConfigError: an agent key in ``config.agents`` cannot be loaded.
    """
    credentials = _credentials(config)
    # Checked here, before the lifespan: a wrong [courses] table stops the start-up.
    course_settings: CourseSettings | None = None
    course_routes: list[BaseRoute] = []
    if config.courses:
        from courses.endpoint import course_endpoint
        from courses.settings import CourseSettings

        course_settings = CourseSettings.from_table(config.courses, base_dir=config.agents_base_dir)
        course_routes.append(WebSocketRoute("/course", _ASGIEndpoint(course_endpoint)))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        broker = Broker(
            config,
            broker_id=broker_identity(config),
            credentials=credentials,
            log=log or logging.getLogger("asbp.gateway"),
        )
        try:
            await broker.start()
        except AsbpError as exc:
            # Said here, in one readable line: the server reports only that the
            # lifespan failed, with the whole traceback folded into one string.
            broker.log.critical(
                "broker.start_failed", extra={"code": int(exc.code), "error": exc.message}
            )
            raise
        courses = await _start_courses(config, course_settings, broker)
        # WebSocket Channels that resume on any broker (gateway.connections.resume).
        resume = ChannelResume(broker)
        resume.start()
        # HTTP Channels' Subjects and groups at one home broker (after the resume's
        # hooks: it chains them).
        if broker.plane.spans_brokers:
            broker.http_bus = HttpBus(broker)
        # Also on app.state, so the server can close Channels and Tubes before it
        # drains connections (see gateway.ops.server).
        app.state.broker = broker
        app.state.courses = courses
        try:
            yield {
                "broker": broker,
                "throttle": HandshakeThrottle(config.failed_handshakes_per_minute),
                HANDSHAKES: HandshakeBound(config.channels.max_handshakes),
                "courses": courses,
                "resume": resume,
            }
        finally:
            if broker.http_bus is not None:
                await broker.http_bus.stop()
            await resume.stop()
            if courses is not None:
                await courses.stop()
            await broker.stop()

    # The demo's page, only when asked for (asbp demo): a broker serves no files otherwise.
    pages = demo_page.routes() if config.demo_page else []
    metrics = [Route("/metrics", _metrics)] if config.metrics.enabled else []
    management: list[BaseRoute] = []
    if config.management.enabled:
        management += api_routes(config)
        # How the console signs in, and the OIDC sign-in's routes when configured.
        management.append(auth_route(config.management))
        if config.management.oidc_discovery_url is not None:
            management += ConsoleSignIn(config.management).routes()
        # The console is only files: what it may see and do is the API's to decide.
        management.append(Mount("/console", StaticFiles(directory=STATIC, html=True)))
    return _BrokerApp(
        websockets={"/asbp": websocket.channel_endpoint, "/tube": websocket.tube_endpoint},
        routes=[
            *pages,
            Route("/healthz", _healthz),
            Route("/readyz", _readyz),
            *metrics,
            *management,
            Route("/asbp", cors.with_cors(http.post), methods=["POST"]),
            Route("/asbp", cors.with_cors(http.poll), methods=["GET"]),
            Route("/asbp", cors.preflight, methods=["OPTIONS"]),
            WebSocketRoute("/asbp", _ASGIEndpoint(websocket.channel_endpoint)),
            WebSocketRoute("/tube", _ASGIEndpoint(websocket.tube_endpoint)),
            *course_routes,
        ],
        lifespan=lifespan,
    )
