"""Tests for gateway.ops.logs: real loggers writing to real streams, lines parsed back."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path

import orjson
import pytest

from gateway.ops.logs import LEVELS, JsonFormatter, TextFormatter, configure_logging
from tests.support import T

ROOT = Path(__file__).resolve().parents[3]
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


class Fault(IntEnum):
    SLOW_CONSUMER = 2105


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A private logger whose lines land in a StringIO; the root logger is not involved."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger(f"test.logs.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield logger, stream, handler
    finally:
        logger.removeHandler(handler)


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_has_the_core_fields_and_the_extras(
    logged: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = logged
    handler.setFormatter(JsonFormatter())
    before = time.time()

    logger.warning(
        "slow consumer %s",
        "c1",
        extra={
            "channel": "c1",
            "tube": None,
            "agent": "billing",
            "command": "display text",
            "code": Fault.SLOW_CONSUMER,
            "remote": "10.0.0.7:51234",
            "sizes": [1, 2],
        },
    )

    (line,) = json_lines(stream)
    assert line == {
        "ts": line["ts"],
        "level": "warning",
        "logger": logger.name,
        "event": "slow consumer c1",
        "channel": "c1",
        "tube": None,
        "agent": "billing",
        "command": "display text",
        "code": 2105,
        "remote": "10.0.0.7:51234",
        "sizes": [1, 2],
    }
    assert list(line)[:4] == ["ts", "level", "logger", "event"]
    assert isinstance(line["ts"], str) and RFC3339_UTC.fullmatch(line["ts"])
    stamp = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert stamp.tzinfo == UTC
    assert before - 1 <= stamp.timestamp() <= time.time() + 1


def test_exceptions_and_stacks_are_fields(
    logged: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = logged
    handler.setFormatter(JsonFormatter())
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logger.exception("dispatch failed", extra={"channel": "c2"})
    logger.info("where am I", stack_info=True)

    failed, located = json_lines(stream)
    assert failed["level"] == "error" and failed["channel"] == "c2"
    assert isinstance(failed["exc"], str)
    assert failed["exc"].startswith("Traceback") and "ZeroDivisionError" in failed["exc"]
    assert isinstance(located["stack"], str) and "test_exceptions_and_stacks" in located["stack"]
    assert "exc" not in located


def test_values_json_cannot_hold_never_lose_the_line(
    logged: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = logged
    handler.setFormatter(JsonFormatter())
    marker = object()

    logger.info(
        "odd values",
        extra={
            "raw": b"\x00\xff",
            "path": Path("/var/lib/asbp"),
            "huge": 2**70,  # beyond 64 bits: orjson refuses it outright
            "surrogate": "caf\udce9",  # a lone surrogate is not valid UTF-8
            "marker": marker,
            "broken": Unprintable(),
            "keys": {1: "one"},
        },
    )
    # A message that cannot be formatted. Built by hand: pytest's own capture handler
    # would raise on it before ours ran.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "bad %s %s", ("one",), None)
    bad_format = orjson.loads(JsonFormatter().format(record))

    (odd,) = json_lines(stream)
    assert odd["raw"] == "b'\\x00\\xff'"
    assert odd["path"] == "/var/lib/asbp"
    assert odd["huge"] == str(2**70)
    assert odd["surrogate"] == "caf\\udce9"
    assert odd["marker"] == str(marker)
    assert odd["broken"] == "<unprintable Unprintable>"
    assert odd["keys"] == {"1": "one"}
    assert bad_format["event"] == "bad %s %s ('one',)"


def test_extras_that_collide_with_core_fields_are_renamed(
    logged: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = logged
    handler.setFormatter(JsonFormatter())
    logger.info("collide", extra={"level": "mine", "event": "also mine", "ts": 1})

    (line,) = json_lines(stream)
    assert (line["level"], line["event"]) == ("info", "collide")
    assert (line["extra_level"], line["extra_event"], line["extra_ts"]) == ("mine", "also mine", 1)


def test_text_lines_are_for_people(
    logged: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = logged
    handler.setFormatter(TextFormatter())
    logger.info("tube opened", extra={"tube": "t1", "agent": "bill ing", "code": 7, "empty": ""})
    try:
        raise KeyError("k")
    except KeyError:
        logger.error("boom", exc_info=True)

    lines = stream.getvalue().splitlines()
    assert re.fullmatch(
        rf"{RFC3339_UTC.pattern} info     {re.escape(logger.name)}: tube opened "
        r'tube=t1 agent="bill ing" code=7 empty=""',
        lines[0],
    )
    assert lines[1].endswith(f"error    {logger.name}: boom")
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "KeyError: 'k'"


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Restore the root logger and warnings capture after configure_logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hpack_level = logging.getLogger("hpack").level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
        logging.getLogger("hpack").setLevel(hpack_level)
        logging.captureWarnings(False)


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_installs_one_handler_on_the_root() -> None:
    root = logging.getLogger()
    first_stream, second_stream = io.StringIO(), io.StringIO()

    first = configure_logging("text", "DEBUG", stream=first_stream)
    second = configure_logging("json", "warning", stream=second_stream)
    logging.getLogger("gateway.test").info("dropped: below warning")
    logging.getLogger("gateway.test").error("kept", extra={"channel": "c"})

    assert first not in root.handlers and second in root.handlers
    assert root.level == logging.WARNING
    assert first_stream.getvalue() == ""
    (line,) = json_lines(second_stream)
    assert (line["event"], line["channel"], line["logger"]) == ("kept", "c", "gateway.test")


@pytest.mark.usefixtures("root_logging")
def test_hpack_stays_quiet_even_at_debug() -> None:
    configure_logging("json", "debug", stream=io.StringIO())
    # hpack logs each decoded header at DEBUG, Authorization included.
    assert logging.getLogger("hpack").getEffectiveLevel() == logging.INFO
    assert logging.getLogger().level == logging.DEBUG


@pytest.mark.parametrize(
    ("format", "level", "message"),
    [
        ("xml", "info", "log format must be 'json' or 'text', not 'xml'"),
        ("json", "loud", "log level must be one of debug, info, warning, error, critical"),
    ],
)
def test_configure_logging_refuses_unknown_names(format: str, level: str, message: str) -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    with pytest.raises(ValueError, match=re.escape(message)):
        configure_logging(format, level)  # type: ignore[arg-type]  # testing a bad value
    assert root.handlers == handlers


def test_levels_are_the_standard_ones() -> None:
    assert {name: logging.getLevelName(name.upper()) for name in LEVELS} == LEVELS


def test_importing_changes_no_logging_configuration() -> None:
    probe = (
        "import logging, warnings\n"
        "root = logging.getLogger()\n"
        "before = (list(root.handlers), root.level, logging.getLogger('hpack').level)\n"
        "import gateway.ops.logs\n"
        "after = (list(root.handlers), root.level, logging.getLogger('hpack').level)\n"
        "assert before == after, (before, after)\n"
        "assert warnings.showwarning.__module__ == 'warnings'\n"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, timeout=20 * T)
