"""Structured logging: one JSON object per line for machines, or text for people.

A log call names an *event* and passes its details as ``extra`` fields::

    logger.info("tube opened", extra={"tube": tube_id, "agent": identity, "remote": peer})

:class:`JsonFormatter` writes that as::

    {"ts":"2025-06-01T12:00:00.123Z","level":"info","logger":"gateway.connections.tubes",
     "event":"tube opened","tube":"t1","agent":"billing","remote":"10.0.0.7:51234"}

(on one line). Field names in use across the gateway: ``channel``, ``tube``, ``agent``,
``command``, ``code`` (a fault code), ``remote`` (the peer's address). A formatter must
never be the reason a log line is lost, so a value that JSON cannot hold is written as
its ``str()``, and text that is not valid Unicode is escaped.

Importing this module changes nothing; :func:`configure_logging` is the one call that
touches the process's logging configuration, and the CLI makes it.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Final, Literal, TextIO

import orjson

__all__ = ["LEVELS", "JsonFormatter", "LogFormat", "TextFormatter", "configure_logging"]

LogFormat = Literal["json", "text"]

#: Level names accepted by :func:`configure_logging`, case-insensitively.
LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES: Final = frozenset(
    {
        *vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)),
        "message",
        "asctime",
        "taskName",  # Python 3.12+
        "color_message",  # Uvicorn's ANSI-coloured copy of the message
    }
)
_CORE_FIELDS: Final = ("ts", "level", "logger", "event")
_JSON_OPTIONS: Final = orjson.OPT_NON_STR_KEYS
# hpack logs every header it encodes or decodes at DEBUG, Authorization included: a
# bearer credential must not reach the log even at the most verbose level.
_QUIET_LOGGERS: Final = ("hpack",)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``event``, the extras.

    ``ts`` is RFC 3339 in UTC with milliseconds, ``level`` the lower-case level name and
    ``event`` the formatted message. Every ``extra=`` field follows under its own name
    (renamed ``extra_<name>`` if it collides with one of the four), then ``exc`` with
    the formatted traceback and ``stack`` with the stack, when the record has them.
    """

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _message(record),
        }
        for key, value in _extras(record):
            payload[f"extra_{key}" if key in _CORE_FIELDS else key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(payload, default=_to_str, option=_JSON_OPTIONS).decode()
        except TypeError:
            # orjson.JSONEncodeError: an int beyond 64 bits, a lone surrogate in a str,
            # a cycle. Fall back field by field, so only the bad field loses its type.
            return orjson.dumps(_sanitise(payload), default=_to_str, option=_JSON_OPTIONS).decode()


class TextFormatter(logging.Formatter):
    """``ts level logger: event key=value ...`` on one line, then any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname.lower():<8} {record.name}: "
        line += _safe_str(_message(record))
        for key, value in _extras(record):
            line += f" {_safe_str(key)}={_text_value(value)}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _GatewayHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs, so a second call can replace it."""


def configure_logging(
    format: LogFormat, level: str, *, stream: TextIO | None = None
) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` in ``format``.

    Configures the root logger: sets its level and installs one handler, replacing the
    one an earlier call installed (handlers others added, pytest's for one, stay).
    Python warnings are routed into logging too, so they are structured as well.

    Args:
        format: ``json`` for one JSON object per line, ``text`` for people.
        level: a name from :data:`LEVELS`, in any case.
        stream: where lines go; standard error by default.

    Returns:
        The installed handler, for a caller that wants to remove it again.

    Raises:
        ValueError: an unknown ``format`` or ``level``.
    """
    formatters: dict[str, type[logging.Formatter]] = {
        "json": JsonFormatter,
        "text": TextFormatter,
    }
    if format not in formatters:
        raise ValueError(f"log format must be 'json' or 'text', not {format!r}")
    numeric = LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")

    handler = _GatewayHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatters[format]())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _GatewayHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.INFO))
    logging.captureWarnings(True)
    return handler


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a format string that does not match its arguments
        return f"{_safe_str(record.msg)} {_safe_str(record.args)}"


def _extras(record: logging.LogRecord) -> list[tuple[str, object]]:
    return [
        (key, value)
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRIBUTES and not key.startswith("_")
    ]


def _to_str(value: object) -> str:
    """orjson's ``default``: any value it cannot serialise becomes its ``str()``."""
    return _safe_str(value)


def _safe_str(value: object) -> str:
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # a broken __str__ must not lose the log line
        text = f"<unprintable {type(value).__name__}>"
    # A lone surrogate (from a bytes path decoded with surrogateescape, say) is not
    # valid UTF-8; write it as an escape instead.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _sanitise(payload: dict[str, Any]) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for key, value in payload.items():
        try:
            orjson.dumps(value, default=_to_str, option=_JSON_OPTIONS)
        except TypeError:
            value = _safe_str(value)
        clean[_safe_str(key)] = value
    return clean


def _text_value(value: object) -> str:
    text = _safe_str(value)
    if text and not any(c.isspace() or c in "\"'=" for c in text):
        return text
    return orjson.dumps(text).decode()
