"""The SDK's errors sit under asbp.AsbpError, keep their old behaviour, and read faults."""

from __future__ import annotations

import pickle

import pytest

from agents import AgentError, ConnectionLost, FaultError, NotConnected
from agents.multipart import MultipartError
from agents.spark.analytics_publish import PublishError
from agents.spark.errors import SparkError
from agents.streams import StreamError
from asbp import AsbpError, FaultCode, fault_command


@pytest.mark.parametrize(
    "error",
    [
        AgentError("x"),
        ConnectionLost("x"),
        NotConnected("x"),
        MultipartError("x"),
        StreamError("x"),
        SparkError("x"),
        PublishError("x"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_sdk_errors_are_asbp_errors_that_print_their_message(error: AgentError) -> None:
    assert isinstance(error, AsbpError)
    assert str(error) == error.message == "x"
    # Escaping a handler, an SDK error means the Respondent failed.
    assert error.code is FaultCode.RESPONDENT_FAILED


def test_a_fault_error_reads_the_fault_command() -> None:
    error = FaultError.from_command(
        fault_command(FaultCode.ACCESS_DENIED, "not you", command_id=4, cause="orders.create")
    )
    assert isinstance(error, AsbpError)
    assert (error.code, error.message, error.command_id, error.cause) == (
        3201,
        "not you",
        4,
        "orders.create",
    )
    assert error.fault is FaultCode.ACCESS_DENIED
    assert str(error) == "3201 (orders.create): not you"


def test_a_fault_error_keeps_a_code_our_table_lacks() -> None:
    error = FaultError.from_command(fault_command(4999, "theirs"))
    assert error.code == 4999 and error.fault is None
    assert str(error) == "4999: theirs"


def test_a_fault_error_survives_pickling() -> None:
    # Its args are (code, message), as before it joined the tree, so it rebuilds.
    copy = pickle.loads(pickle.dumps(FaultError(2101, "no one")))
    assert (copy.code, copy.message, str(copy)) == (2101, "no one", "2101: no one")
