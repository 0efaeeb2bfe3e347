"""The ``analytics.query`` language: a small JSON query, safe by construction.

A User-Agent never sends SQL. It sends one JSON object naming a registered
table and, optionally, filters, a grouping with aggregates, an order and a
limit::

    {
      "table": "events",
      "where": [{"column": "outcome", "op": "=", "value": "fault"}],
      "group_by": ["broker"],
      "aggregate": [{"fn": "count", "as": "faults"},
                    {"fn": "avg", "column": "latency_us", "as": "mean_latency_us"}],
      "order_by": [{"column": "faults", "desc": true}],
      "limit": 10
    }

Every name is checked against the table's schema before Spark sees it, and the
query is built with DataFrame calls (``where``, ``groupBy``, ``agg``...), never
by pasting text into SQL, so a query can read the tables it was given and
nothing else. The rules, which ``docs/spark.md`` repeats:

* ``table`` (required): one of the agent's registered tables.
* ``select``: columns to return; all of them by default. Not allowed together
  with ``group_by`` or ``aggregate``, whose result columns are the grouping
  columns followed by the aggregates' names.
* ``where``: conditions, all of which must hold. ``op`` is one of
  :data:`OPERATORS`; ``value`` is a JSON scalar of the column's type (a number
  for numeric columns, a string for strings, ``true``/``false`` for booleans,
  an ISO 8601 string for dates and timestamps), a list of them for ``in`` and
  ``not in``, and absent for ``is null`` and ``is not null``.
* ``group_by``: columns to group by; alone, it returns their distinct values.
* ``aggregate``: ``{"fn", "column", "as"}`` items, ``fn`` one of
  :data:`FUNCTIONS`. ``column`` may be left out only for ``count`` (rows);
  ``as`` names the result column (default ``<fn>_<column>``, or ``count``).
* ``order_by``: result columns, each a name (ascending) or
  ``{"column": name, "desc": true}``.
* ``limit``: at most this many rows (the agent's ``max_rows`` caps it anyway).

Unknown keys, unknown columns, values of the wrong type and oversized lists are
refused with :class:`QueryError` (fault 1201) before any Spark job starts.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    NumericType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from agents.spark.errors import SparkError
from asbp import FaultCode

__all__ = [
    "FUNCTIONS",
    "MAX_ITEMS",
    "MAX_VALUES",
    "OPERATORS",
    "Aggregate",
    "Condition",
    "Order",
    "Query",
    "QueryError",
]

#: The comparison operators of ``where``.
OPERATORS: Final = (
    "=",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "in",
    "not in",
    "is null",
    "is not null",
    "contains",
    "starts with",
)
#: The aggregate functions of ``aggregate``.
FUNCTIONS: Final = ("count", "count_distinct", "sum", "avg", "min", "max")
#: Items in ``select``, ``where``, ``group_by``, ``aggregate`` or ``order_by``.
MAX_ITEMS: Final = 64
#: Values in one ``in`` or ``not in`` list.
MAX_VALUES: Final = 1000
#: Characters in one string value.
MAX_STRING: Final = 4096

Scalar: TypeAlias = str | int | float | bool
Operator: TypeAlias = Literal[
    "=",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "in",
    "not in",
    "is null",
    "is not null",
    "contains",
    "starts with",
]
Function: TypeAlias = Literal["count", "count_distinct", "sum", "avg", "min", "max"]

_KEYS: Final = frozenset({"table", "select", "where", "group_by", "aggregate", "order_by", "limit"})
_ALIAS: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ORDERED: Final = (NumericType, StringType, DateType, TimestampType, TimestampNTZType, BooleanType)


class QueryError(SparkError):
    """A query, or a Spark Respondent's request, that cannot be answered.

    The agent answers it with an ``asbp.fault`` carrying ``code`` and
    ``message``; Spark Respondents may raise it too.

    Attributes:
        code: the fault code (1201 for a malformed or invalid query).
        message: what is wrong, for the requester.
    """

    def __init__(self, message: str, code: FaultCode = FaultCode.INVALID_MESSAGE_FORMAT) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True, slots=True)
class Condition:
    """One ``where`` item."""

    column: str
    op: Operator
    value: Scalar | tuple[Scalar, ...] | None


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One ``aggregate`` item; ``column`` is None only for ``count`` (rows)."""

    fn: Function
    column: str | None
    alias: str


@dataclass(frozen=True, slots=True)
class Order:
    """One ``order_by`` item."""

    column: str
    descending: bool


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed ``analytics.query``; :meth:`parse` checks its shape, :meth:`apply` the names."""

    table: str
    select: tuple[str, ...] = ()
    where: tuple[Condition, ...] = ()
    group_by: tuple[str, ...] = ()
    aggregate: tuple[Aggregate, ...] = ()
    order_by: tuple[Order, ...] = ()
    limit: int | None = None

    @property
    def aggregating(self) -> bool:
        """Whether the result is grouped (``group_by`` or ``aggregate``)."""
        return bool(self.group_by or self.aggregate)

    @classmethod
    def parse(cls, body: bytes | str) -> Query:
        """Read a query from a request body (UTF-8 JSON).

        Raises:
            QueryError: not JSON, or not shaped like a query.
        """
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise QueryError(f"the query is not JSON: {exc}") from exc
        return cls.from_json(document)

    @classmethod
    def from_json(cls, document: object) -> Query:
        """Read a query from a decoded JSON value.

        Raises:
            QueryError: not shaped like a query.
        """
        if not isinstance(document, dict):
            raise QueryError("the query must be a JSON object")
        unknown = sorted(set(document) - _KEYS)
        if unknown:
            raise QueryError(f"unknown query keys {unknown}; allowed: {sorted(_KEYS)}")
        table = document.get("table")
        if not isinstance(table, str) or not table:
            raise QueryError("'table' must name a table")
        select = _names(document.get("select", []), "select")
        group_by = _names(document.get("group_by", []), "group_by")
        where = tuple(_condition(item) for item in _items(document.get("where", []), "where"))
        aggregate = tuple(
            _aggregate(item) for item in _items(document.get("aggregate", []), "aggregate")
        )
        order_by = tuple(_order(item) for item in _items(document.get("order_by", []), "order_by"))
        limit = document.get("limit")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise QueryError("'limit' must be a non-negative integer")
        if select and (group_by or aggregate):
            raise QueryError(
                "'select' cannot be combined with 'group_by' or 'aggregate': "
                "the result is the grouping columns and the aggregates"
            )
        aliases = [a.alias for a in aggregate]
        clashes = sorted(
            {n for n in aliases if aliases.count(n) > 1} | (set(aliases) & set(group_by))
        )
        if clashes:
            raise QueryError(f"result columns named twice: {clashes}")
        return cls(table, select, where, group_by, aggregate, order_by, limit)

    # -- against a table ---------------------------------------------------

    def output_columns(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The result's column names, for a table with ``columns``."""
        if self.aggregating:
            return self.group_by + tuple(a.alias for a in self.aggregate)
        return self.select or tuple(columns)

    def apply(self, df: DataFrame) -> DataFrame:
        """The query as DataFrame operations on ``df`` (lazy: nothing runs yet).

        Raises:
            QueryError: a column the table lacks, or a value or function that
                does not fit a column's type.
        """
        types = {field.name: field.dataType for field in df.schema.fields}
        for name in (*self.select, *self.group_by):
            _check_column(name, types)
        result = df
        for condition in self.where:
            result = result.where(_predicate(condition, types))
        if self.aggregate:
            measures = [_measure(item, types) for item in self.aggregate]
            grouped = result.groupBy(*(_col(n) for n in self.group_by))
            result = grouped.agg(*measures)
        elif self.group_by:
            result = result.select(*(_col(n) for n in self.group_by)).distinct()
        elif self.select:
            result = result.select(*(_col(n) for n in self.select))
        output = self.output_columns(list(types))
        if self.order_by:
            ordering = []
            for order in self.order_by:
                if order.column not in output:
                    raise QueryError(
                        f"cannot order by {order.column!r}: not a result column {list(output)}"
                    )
                column = _col(order.column)
                ordering.append(column.desc() if order.descending else column.asc())
            result = result.orderBy(*ordering)
        if self.limit is not None:
            result = result.limit(self.limit)
        return result


# -- shape ------------------------------------------------------------------


def _items(value: object, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise QueryError(f"{key!r} must be a list")
    if len(value) > MAX_ITEMS:
        raise QueryError(f"{key!r} has more than {MAX_ITEMS} items")
    return value


def _names(value: object, key: str) -> tuple[str, ...]:
    names = _items(value, key)
    for name in names:
        if not isinstance(name, str) or not name:
            raise QueryError(f"{key!r} must be a list of column names")
    if len(set(names)) != len(names):
        raise QueryError(f"{key!r} names a column twice")
    return tuple(names)


def _object(item: object, key: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise QueryError(f"each {key!r} item must be an object")
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise QueryError(f"unknown keys {unknown} in a {key!r} item; allowed: {sorted(allowed)}")
    return item


def _column_name(item: Mapping[str, Any], key: str) -> str:
    column = item.get("column")
    if not isinstance(column, str) or not column:
        raise QueryError(f"each {key!r} item needs a 'column'")
    return column


def _scalar(value: object) -> Scalar:
    if isinstance(value, bool | int | str):
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise QueryError(f"a string value is longer than {MAX_STRING} characters")
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise QueryError(f"values must be strings, numbers or booleans, not {value!r}")


def _condition(item: object) -> Condition:
    fields = _object(item, "where", {"column", "op", "value"})
    column = _column_name(fields, "where")
    op = fields.get("op")
    if op not in OPERATORS:
        raise QueryError(f"'op' must be one of {list(OPERATORS)}, not {op!r}")
    has_value = "value" in fields
    value = fields.get("value")
    if op in ("is null", "is not null"):
        if has_value:
            raise QueryError(f"{op!r} takes no 'value'")
        return Condition(column, op, None)
    if op in ("in", "not in"):
        if not isinstance(value, list) or not value:
            raise QueryError(f"{op!r} needs a non-empty list 'value'")
        if len(value) > MAX_VALUES:
            raise QueryError(f"{op!r} takes at most {MAX_VALUES} values")
        return Condition(column, op, tuple(_scalar(v) for v in value))
    if not has_value or value is None:
        raise QueryError(f"{op!r} needs a 'value' (use 'is null' to test for null)")
    return Condition(column, op, _scalar(value))


def _aggregate(item: object) -> Aggregate:
    fields = _object(item, "aggregate", {"fn", "column", "as"})
    fn = fields.get("fn")
    if fn not in FUNCTIONS:
        raise QueryError(f"'fn' must be one of {list(FUNCTIONS)}, not {fn!r}")
    column = fields.get("column")
    if column is None:
        if fn != "count":
            raise QueryError(f"{fn!r} needs a 'column'")
    elif not isinstance(column, str) or not column:
        raise QueryError("an aggregate's 'column' must be a column name")
    alias = fields.get("as")
    if alias is None:
        alias = fn if column is None else f"{fn}_{column}"
    if not isinstance(alias, str) or not _ALIAS.fullmatch(alias):
        raise QueryError(f"'as' must be a name of letters, digits and '_' (got {alias!r})")
    return Aggregate(fn, column, alias)


def _order(item: object) -> Order:
    if isinstance(item, str) and item:
        return Order(item, False)
    fields = _object(item, "order_by", {"column", "desc"})
    descending = fields.get("desc", False)
    if not isinstance(descending, bool):
        raise QueryError("'desc' must be true or false")
    return Order(_column_name(fields, "order_by"), descending)


# -- against the schema ---------------------------------------------------


def _col(name: str) -> Column:
    # Backticks: the name is one column, even with dots or spaces in it.
    return F.col("`" + name.replace("`", "``") + "`")


def _check_column(name: str, types: Mapping[str, DataType]) -> DataType:
    try:
        return types[name]
    except KeyError:
        raise QueryError(f"no column {name!r}; the table has {list(types)}") from None


def _literal(value: Scalar, column: str, kind: DataType) -> Column:
    """``value`` as a literal of ``column``'s type, or a QueryError."""
    if isinstance(kind, NumericType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise QueryError(f"{column!r} is numeric: compare it with a number")
        return F.lit(value)
    if isinstance(kind, StringType):
        if not isinstance(value, str):
            raise QueryError(f"{column!r} is a string column: compare it with a string")
        return F.lit(value)
    if isinstance(kind, BooleanType):
        if not isinstance(value, bool):
            raise QueryError(f"{column!r} is boolean: compare it with true or false")
        return F.lit(value)
    if isinstance(kind, DateType | TimestampType | TimestampNTZType):
        if not isinstance(value, str):
            raise QueryError(f"{column!r} is a {kind.simpleString()}: use an ISO 8601 string")
        try:
            if isinstance(kind, DateType):
                return F.lit(datetime.date.fromisoformat(value))
            datetime.datetime.fromisoformat(value)
        except ValueError:
            raise QueryError(f"{value!r} is not an ISO 8601 date or time") from None
        # Spark reads the text itself: a time without an offset is then in the
        # session's time zone (spark.sql.session.timeZone), not this process's.
        return F.lit(value).cast(kind)
    raise QueryError(f"{column!r} is a {kind.simpleString()}; it cannot be compared")


def _predicate(condition: Condition, types: Mapping[str, DataType]) -> Column:
    kind = _check_column(condition.column, types)
    column = _col(condition.column)
    op, value = condition.op, condition.value
    if op == "is null":
        return column.isNull()
    if op == "is not null":
        return column.isNotNull()
    if isinstance(value, tuple):
        literals = [_literal(v, condition.column, kind) for v in value]
        inside = column.isin(*literals)
        return inside if op == "in" else ~inside
    assert value is not None  # _condition requires one
    if op in ("contains", "starts with"):
        if not isinstance(kind, StringType):
            raise QueryError(f"{op!r} needs a string column; {condition.column!r} is not")
        literal = _literal(value, condition.column, kind)
        return column.contains(literal) if op == "contains" else column.startswith(literal)
    literal = _literal(value, condition.column, kind)
    if op == "=":
        return column == literal
    if op == "!=":
        return column != literal
    if op == "<":
        return column < literal
    if op == "<=":
        return column <= literal
    if op == ">":
        return column > literal
    return column >= literal


def _measure(item: Aggregate, types: Mapping[str, DataType]) -> Column:
    if item.column is None:
        return F.count(F.lit(1)).alias(item.alias)
    kind = _check_column(item.column, types)
    column = _col(item.column)
    if item.fn in ("sum", "avg") and not isinstance(kind, NumericType):
        raise QueryError(f"{item.fn!r} needs a numeric column; {item.column!r} is not")
    if item.fn in ("min", "max") and not isinstance(kind, _ORDERED):
        raise QueryError(f"{item.fn!r} cannot order {item.column!r} ({kind.simpleString()})")
    if item.fn == "count":
        measure = F.count(column)
    elif item.fn == "count_distinct":
        measure = F.count_distinct(column)
    elif item.fn == "sum":
        measure = F.sum(column)
    elif item.fn == "avg":
        measure = F.avg(column)
    elif item.fn == "min":
        measure = F.min(column)
    else:
        measure = F.max(column)
    return measure.alias(item.alias)
