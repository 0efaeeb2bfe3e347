"""The wire format of a Spark agent's answer: rows in JSON parts, and reading them back.

A result goes out as ``t`` parts (§1.3.4.2 ``t`` and ``o``; see
``agents.streams``), each one Command with ``e=UTF-8``,
``m=application/json`` and a JSON object for a body. The first part says what
the whole result is; every part carries up to ``rows_per_part`` rows, as
objects keyed by column name::

    part 1: {"columns": [{"name": "broker", "type": "string"},
                         {"name": "faults", "type": "bigint"}],
             "row_count": 1234, "truncated": false,
             "rows": [{"broker": "a", "faults": 17}, ...]}
    part 2: {"rows": [...]}

``row_count`` is the number of rows in all the parts together, and
``truncated`` is true when the agent's ``max_rows`` cut the result short. An
empty result is one part (``t=1``) with no rows: a User-Agent always gets an
answer, and ``t=0`` would announce a stream with nothing to end it.

Values become JSON as follows: numbers, strings, booleans and null as they are;
NaN and infinities as null (JSON has none); dates and timestamps as ISO 8601
strings; decimals as strings (exact); binary as base64; arrays, maps and
structs as lists and objects.

This module needs no pyspark: a User-Agent reads results with
:func:`read_result` or :func:`fetch`.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from agents.errors import AgentError
from agents.streams import StreamPart, ordered_parts
from agents.user_agent import UserAgent
from asbp import Command

__all__ = [
    "MIME_TYPE",
    "ColumnInfo",
    "QueryResult",
    "encode_part",
    "fetch",
    "json_row",
    "json_value",
    "read_result",
]

#: ``m`` of every part.
MIME_TYPE: Final = "application/json"

#: A row as it travels: column name → JSON value.
JsonRow: TypeAlias = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One result column: its name and, for a DataFrame, its Spark SQL type."""

    name: str
    type: str | None = None


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A whole result, reassembled from its parts in ``o`` order."""

    columns: tuple[ColumnInfo, ...]
    rows: tuple[JsonRow, ...]
    #: Whether ``max_rows`` cut the result short.
    truncated: bool
    #: How many parts it came in (``t``).
    parts: int


def json_value(value: object) -> Any:
    """One value as JSON can carry it (see the module docstring)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else None
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "asDict"):  # a pyspark Row (a struct)
        return {str(k): json_value(v) for k, v in value.asDict().items()}
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


def json_row(row: object) -> JsonRow:
    """A result row (a pyspark Row or a mapping) as a JSON object.

    Raises:
        TypeError: the row is neither.
    """
    if hasattr(row, "asDict"):
        items = row.asDict().items()
    elif isinstance(row, Mapping):
        items = row.items()
    else:
        raise TypeError(f"a result row must be a Row or a mapping, not {type(row).__name__}")
    return {str(key): json_value(value) for key, value in items}


def encode_part(
    rows: Sequence[JsonRow],
    *,
    columns: Sequence[ColumnInfo] | None = None,
    row_count: int = 0,
    truncated: bool = False,
) -> bytes:
    """One part's body; ``columns`` (and the counts) only for the first part."""
    document: dict[str, Any] = {}
    if columns is not None:
        document["columns"] = [
            {"name": c.name, "type": c.type} if c.type else {"name": c.name} for c in columns
        ]
        document["row_count"] = row_count
        document["truncated"] = truncated
    document["rows"] = rows
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _document(part: StreamPart) -> dict[str, Any]:
    try:
        document = json.loads(part.command.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AgentError(f"part {part.position} is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
        raise AgentError(f"part {part.position} has no 'rows' list")
    return document


async def read_result(parts: AsyncIterable[StreamPart]) -> QueryResult:
    """Reassemble a result from its parts, as :func:`~agents.streams.ordered_parts` yields them.

    Raises:
        AgentError: a part is not of this format, or the rows do not add up
            to the first part's ``row_count``.
    """
    columns: tuple[ColumnInfo, ...] = ()
    rows: list[JsonRow] = []
    row_count = 0
    truncated = False
    total = 0
    async for part in parts:
        document = _document(part)
        if part.position == 1:
            raw_columns = document.get("columns")
            count = document.get("row_count")
            if not isinstance(raw_columns, list) or type(count) is not int:
                raise AgentError("the first part lacks 'columns' or 'row_count'")
            columns = tuple(ColumnInfo(str(c["name"]), c.get("type")) for c in raw_columns)
            row_count = count
            truncated = bool(document.get("truncated", False))
        rows.extend(document["rows"])
        total = part.total
    if len(rows) != row_count:
        raise AgentError(f"the parts hold {len(rows)} rows; the first part announced {row_count}")
    return QueryResult(columns, tuple(rows), truncated, total)


async def fetch(
    user_agent: UserAgent,
    query: Mapping[str, Any],
    *,
    name: str = "analytics.query",
    timeout: float | None = 30.0,
    progress: Callable[[StreamPart], Awaitable[None] | None] | None = None,
) -> QueryResult:
    """Send ``query`` to a Spark agent and reassemble its answer.

    Args:
        user_agent: a connected User-Agent.
        query: the query (see ``agents.spark.query``).
        name: the Respondent's Command-Name.
        timeout: seconds to wait for each part.
        progress: called with every part, in order (``part.position`` of
            ``part.total``), as it arrives.

    Raises:
        FaultError: the agent refused the query or failed while answering.
        AgentError: the answer is malformed.
        ConnectionLost, TimeoutError: as for ``UserAgent.request``.
    """
    body = json.dumps(dict(query), separators=(",", ":"))

    async def watched(stream: AsyncIterator[Command]) -> AsyncIterator[StreamPart]:
        async for part in ordered_parts(stream):
            if progress is not None:
                waiting = progress(part)
                if waiting is not None:
                    await waiting
            yield part

    # aclosing: an answer read only in part (an error) still releases its u.
    async with aclosing(user_agent.stream(name, body, timeout=timeout, m=MIME_TYPE)) as stream:
        return await read_result(watched(stream))
