"""The built-in Command-Names: reserved prefix, carriable, distinct, documented."""

from __future__ import annotations

from pathlib import Path

import pytest

import asbp
from asbp import Command, decode, encode, names
from asbp.header import RESERVED_KEYS

#: Every Command-Name in asbp.names (the prefix and the subprotocol are not ones).
COMMAND_NAMES = {
    attribute: getattr(names, attribute)
    for attribute in names.__all__
    if attribute
    not in {"PREFIX", "MESSAGING", "BEARER_SUBPROTOCOL_PREFIX", "SECRET_KEY", "SECRET_HEADER"}
}
PROTOCOL_MD = Path(__file__).parents[2] / "docs" / "protocol.md"


def test_every_command_name_is_listed() -> None:
    assert len(COMMAND_NAMES) == 24


@pytest.mark.parametrize("name", sorted(COMMAND_NAMES.values()))
def test_a_built_in_name_is_reserved_and_travels_as_c(name: str) -> None:
    # The broker refuses to let an agent register a PREFIX name, so every name it
    # answers itself must carry the prefix; and it must survive the codec bare.
    assert name.startswith(names.PREFIX)
    command = Command(c=name, u=asbp.MAX_COMMAND_ID)
    assert decode(encode(command)) == command
    assert encode(command).startswith(f"c={name},".encode("ascii"))


def test_names_are_distinct() -> None:
    assert len(set(COMMAND_NAMES.values())) == len(COMMAND_NAMES)


def test_messaging_is_the_seven_topic_and_queue_names() -> None:
    assert {
        names.PUBLISH,
        names.SUBSCRIBE,
        names.UNSUBSCRIBE,
        names.POLL,
        names.ACK,
        names.NOTIFICATION,
        names.NOTICE,
    } == names.MESSAGING


def test_the_secret_s_key_and_header_travel_as_they_are() -> None:
    # The key is an ordinary header key, and its value (URL-safe base64) a plain value.
    command = Command(c=names.ACCEPTED, **{names.SECRET_KEY: "aZ09-_" * 7 + "x"})
    assert decode(encode(command)) == command
    # The header name is an RFC 9110 token, and no reserved key stands for it.
    assert names.SECRET_HEADER.isascii()
    assert all(ch.isalnum() or ch == "-" for ch in names.SECRET_HEADER)
    assert names.SECRET_KEY not in RESERVED_KEYS


def test_the_bearer_prefix_is_a_websocket_subprotocol_token() -> None:
    # RFC 6455 4.1: a subprotocol is an RFC 2616 token; a JWT (base64url and
    # dots) appended to the prefix stays one.
    assert names.BEARER_SUBPROTOCOL_PREFIX.startswith(names.PREFIX)
    assert all(
        ch.isascii() and (ch.isalnum() or ch in ".-_") for ch in names.BEARER_SUBPROTOCOL_PREFIX
    )


@pytest.mark.parametrize("name", sorted(COMMAND_NAMES.values()))
def test_every_name_is_documented(name: str) -> None:
    assert f"`{name}`" in PROTOCOL_MD.read_text(encoding="utf-8")
