"""Typed operations, and the OpenAPI 3.1 document generated from them.

Each operation of the API is declared once as an :class:`Operation`: method,
path, parameters, body and response types, the scope it needs, and its
handler. The routes (gateway.api.routes) are made from these declarations, and
so is ``/api/v1/openapi.json``, with every schema taken from the msgspec
Structs of gateway.api.schemas by ``msgspec.json.schema_components``: the
document cannot drift from the code, which is what RabbitMQ's hand-kept API
description never had (rabbitmq-management#774).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from gateway.api.schemas import Problem
from gateway.errors import LocalError

__all__ = [
    "API_PREFIX",
    "ApiError",
    "Call",
    "Operation",
    "Param",
    "Scope",
    "openapi_document",
]

API_PREFIX = "/api/v1"

#: What an operation needs from the caller: to read, or to change the broker.
Scope = Literal["read", "write"]


class ApiError(LocalError):
    """An answer other than 2xx, sent as a problem document.

    Args:
        status: the HTTP status.
        detail: what went wrong, for people.
        headers: response headers to add (an RFC 6750 challenge, say).
    """

    def __init__(
        self, status: int, detail: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers) if headers is not None else None


@dataclass(frozen=True, slots=True)
class Param:
    """A path or query parameter."""

    name: str
    where: Literal["path", "query"]
    kind: Literal["string", "integer"]
    doc: str
    required: bool = False
    minimum: int | None = None
    maximum: int | None = None
    default: int | str | None = None
    max_length: int | None = None
    #: A path parameter that may hold ``/`` (queue names do).
    slashes: bool = False
    #: Said after "must be at most <maximum>": what to use instead.
    beyond: str = ""

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": self.kind}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.default is not None:
            schema["default"] = self.default
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        if self.kind == "string" and self.where == "path":
            schema["minLength"] = 1
        return schema

    def read(self, raw: str | None) -> int | str | None:
        """The parameter's value from its text; ApiError 400 if it does not fit."""
        if raw is None:
            if self.required:
                raise ApiError(400, f"{self.name} is required")
            return self.default
        if self.max_length is not None and len(raw) > self.max_length:
            raise ApiError(400, f"{self.name} is longer than {self.max_length} characters")
        if self.kind == "string":
            return raw
        try:
            value = int(raw, 10)
        except ValueError:
            raise ApiError(400, f"{self.name} must be an integer, not {raw[:40]!r}") from None
        if self.minimum is not None and value < self.minimum:
            raise ApiError(400, f"{self.name} must be at least {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ApiError(400, f"{self.name} must be at most {self.maximum}{self.beyond}")
        return value


@dataclass(slots=True)
class Call:
    """One request, as a handler sees it."""

    #: The caller, as authentication named it (logged with every write).
    principal: str
    #: Path and query parameters, read and checked.
    params: dict[str, Any]
    #: The request body, decoded into the operation's ``body`` type.
    body: Any = None
    #: Objects the handlers need (the Broker, the throttle), from the lifespan.
    state: Mapping[str, Any] = field(default_factory=dict)
    #: The status of a success: a handler sets another of its operation's
    #: ``successes`` (202: handed to another broker) when it applies.
    status: int = 200


Handler = Callable[[Call], Awaitable[msgspec.Struct]]


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the API."""

    method: Literal["GET", "POST", "DELETE"]
    #: Below API_PREFIX, with ``{name}`` for path parameters.
    path: str
    operation_id: str
    summary: str
    tag: str
    scope: Scope
    response: type[msgspec.Struct]
    handler: Handler
    params: Sequence[Param] = ()
    body: type[msgspec.Struct] | None = None
    #: Statuses besides 200 and the authentication ones it may answer with.
    errors: tuple[int, ...] = (400,)
    #: Successes besides 200, each with the response's schema (202: accepted,
    #: done by another broker a moment later).
    successes: tuple[int, ...] = ()
    #: What the operation does, at more length than ``summary`` (OpenAPI's ``description``).
    description: str | None = None


_PHRASES = {
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Unprocessable Content",
    503: "Service Unavailable",
}


def problem(status: int, detail: str) -> Problem:
    """The problem document for ``status``."""
    return Problem(title=_PHRASES.get(status, "Error"), status=status, detail=detail)


def openapi_document(operations: Sequence[Operation], *, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``."""
    types: list[Any] = [Problem]
    for operation in operations:
        types.append(operation.response)
        if operation.body is not None:
            types.append(operation.body)
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    ref = dict(zip(types, refs, strict=True))
    problem_content = {"application/problem+json": {"schema": ref[Problem]}}
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        responses: dict[str, Any] = {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": ref[operation.response]}},
            }
        }
        for status in operation.successes:
            responses[str(status)] = {
                "description": _PHRASES.get(status, "Success"),
                "content": {"application/json": {"schema": ref[operation.response]}},
            }
        for status in (*operation.errors, 401, 403):
            responses[str(status)] = {
                "description": _PHRASES.get(status, "Error"),
                "content": problem_content,
            }
        entry: dict[str, Any] = {
            "operationId": operation.operation_id,
            "summary": operation.summary,
            "tags": [operation.tag],
            "security": [{"bearer": [f"asbp:{operation.scope}"]}],
            "parameters": [
                {
                    "name": param.name,
                    "in": param.where,
                    "required": param.required or param.where == "path",
                    "description": param.doc,
                    "schema": param.schema(),
                }
                for param in operation.params
            ],
            "responses": responses,
        }
        if operation.description is not None:
            entry["description"] = operation.description
        if operation.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref[operation.body]}},
            }
        paths.setdefault(API_PREFIX + operation.path, {})[operation.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ASBP broker management API",
            "version": version,
            "description": (
                "Watch and manage an ASBP broker (docs/operations.md). Read operations "
                "need the scope asbp:read, writes asbp:write; with no authentication "
                "configured the API answers on a loopback address only."
            ),
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "The static admin token of [management] token_file, or a JWT "
                        "access token from the configured OAuth 2 issuer."
                    ),
                }
            },
        },
    }
