"""The management API as Starlette routes, made from the declared operations.

Each route authenticates (gateway.api.access), reads and checks its path and
query parameters (``Param.read``), decodes a JSON body into its declared
Struct (a body over 64 KiB, not JSON or not of the schema is a 400), runs the
handler and writes its Struct as JSON. Every failure is a problem document
(RFC 9457) with its status; nothing a caller sends makes a 5xx.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.api.access import ManagementAccess
from gateway.api.declare import API_PREFIX, ApiError, Call, Operation, openapi_document, problem
from gateway.api.operations import OPERATIONS, version
from gateway.api.schemas import to_json
from gateway.config.model import GatewayConfig

__all__ = ["MAX_BODY", "api_routes"]

#: Bytes a request body may hold.
MAX_BODY: Final = 64 * 1024


def _problem_response(error: ApiError) -> Response:
    headers = error.headers
    if headers is None and error.status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="asbp"'}  # no credentials: no error code
    return Response(
        to_json(problem(error.status, error.detail)),
        status_code=error.status,
        media_type="application/problem+json",
        headers=headers,
    )


async def _body(request: Request, kind: type[msgspec.Struct]) -> msgspec.Struct:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(400, f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    try:
        return msgspec.json.decode(b"".join(chunks), type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ApiError(400, f"the body does not fit its schema: {exc}") from exc


def _endpoint(
    operation: Operation, access: ManagementAccess
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            peer = request.client.host if request.client is not None else None
            principal = await access.principal(
                request.headers.get("authorization"), peer, operation.scope
            )
            params = {
                param.name: param.read(
                    request.path_params.get(param.name)
                    if param.where == "path"
                    else request.query_params.get(param.name)
                )
                for param in operation.params
            }
            body = await _body(request, operation.body) if operation.body is not None else None
            call = Call(principal, params, body, state={"broker": request.state.broker})
            result = await operation.handler(call)
        except ApiError as error:
            return _problem_response(error)
        return Response(to_json(result), media_type="application/json")

    return endpoint


def _route_path(operation: Operation) -> str:
    path = API_PREFIX + operation.path
    for param in operation.params:
        if param.slashes:
            path = path.replace("{" + param.name + "}", "{" + param.name + ":path}")
    return path


def api_routes(config: GatewayConfig) -> list[BaseRoute]:
    """The routes of the management API, and of its OpenAPI document.

    Raises:
        ConfigError: ``[management]`` names a token or JWKS that cannot be loaded.
    """
    access = ManagementAccess(config)
    document = to_json(openapi_document(OPERATIONS, version=version()))

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes: list[BaseRoute] = [Route(API_PREFIX + "/openapi.json", openapi)]
    for operation in OPERATIONS:
        routes.append(
            Route(_route_path(operation), _endpoint(operation, access), methods=[operation.method])
        )
    return routes
