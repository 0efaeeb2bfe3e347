"""Application-Agents sending by ``r`` for a Subject they signed in (docs/courses.md,
"From Application-Agents"), between two buses: real brokers on TLS, the SDK's agents.

The agent ``signin`` of bus a.test signs alice in and then speaks for her: bob on bus
b.test gets its Command with ``p=alice*a.test`` and replies to alice's User-Agent. An
agent that did not sign her in (``other``, a bare Tube), a Subject that does not
exist and a Command without ``s`` are refused, and ``p`` written by the agent is never trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import AgentCredentialSource, ApplicationAgent, FaultError, Request, generate_agent_key
from asbp import Command, FaultCode, decode, encode
from asbp.fault_commands import read_fault
from gateway.app import create_app
from tests.courses.buses import LOGIN, Relay, bus_config, make_bus, serve_bus, user
from tests.support import T, TlsFiles, serve_app_async
from tests.support.agents import FAST
from tests.support.tls import client_ssl_context

pytestmark = pytest.mark.anyio


@dataclasses.dataclass
class BusA:
    url: str
    signin: ApplicationAgent
    other_credentials: AgentCredentialSource
    #: name -> (s, b) of each Subject ``signin`` signed in.
    subjects: dict[str, tuple[str, str]]


@contextlib.asynccontextmanager
async def buses(tmp_path: Path, tls: TlsFiles) -> AsyncIterator[tuple[BusA, str]]:
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    private, public = generate_agent_key()
    (bus_a.directory / "other.pem").write_text(public)
    ssl = client_ssl_context(tls)
    async with Relay() as to_a, Relay() as to_b:
        config_a = bus_config(bus_a, {bus_b: to_b.url()}, tls=tls)
        config_a = dataclasses.replace(
            config_a,
            agents={
                **config_a.agents,
                "other": {"public_key": "other.pem", "serves": ["nothing"]},
            },
        )
        config_b = bus_config(bus_b, {bus_a: to_a.url()}, tls=tls)
        async with (
            serve_app_async(create_app(config_a), tls=tls) as a,
            serve_bus(bus_b, config_b, tls) as b,
        ):
            to_a.target, to_b.target = a.port, b.port
            subjects: dict[str, tuple[str, str]] = {}
            signin = ApplicationAgent(
                "signin", bus_a.signin, [a.ws_url + "/tube"], backoff=FAST, timeout=5 * T, ssl=ssl
            )

            @signin.respondent(LOGIN)
            async def login(request: Request) -> None:
                name = request.body.decode()
                subject_id, broker = request.subject_id, request.command.get("b")
                assert subject_id is not None and isinstance(broker, str)
                subjects[name] = (subject_id, broker)
                await request.authenticate("user", address=f"{name}*a.test")

            credentials = AgentCredentialSource("other", private, audience="asbp-broker")
            async with signin:
                await signin.wait_registered(10 * T)
                try:
                    yield BusA(a.ws_url, signin, credentials, subjects), b.ws_url
                finally:
                    await to_a.drain()
                    await to_b.drain()


async def test_an_agent_speaks_for_the_subject_it_signed_in(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        buses(tmp_path, tls_files) as (a, b_url),
        user(a.url, "alice", tls_files) as alice,
        user(b_url, "bob", tls_files) as bob,
    ):
        subject_id, broker = a.subjects["alice"]
        assert subject_id == alice.subject
        hello = Command({"c": "chat", "r": "bob*b.test", "p": "mallory*a.test", "u": 1}, b"hi")
        await a.signin.send_for(subject_id, hello, broker=broker)
        got = await bob.recv()
        assert (got.name, got.publisher, got.body) == ("chat", "alice*a.test", b"hi")
        assert "a" not in got and got.subject_id == bob.subject
        # bob answers by p: alice's User-Agent gets it, not the agent.
        await bob.send(Command({"c": "chat.reply", "r": "alice*a.test", "u": 1}, b"hello"))
        back = await alice.recv()
        assert (back.publisher, back.subject_id, back.body) == (
            "bob*b.test",
            alice.subject,
            b"hello",
        )
        # An unknown address of its own bus: 2201, to the agent.
        with pytest.raises(FaultError) as unknown:
            await a.signin.send_for(
                subject_id, Command({"c": "chat", "r": "nobody*a.test", "u": 2}), confirm=5 * T
            )
        assert unknown.value.code == FaultCode.UNKNOWN_ADDRESS


async def test_only_the_agent_that_signed_a_subject_in_may_speak_for_it(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        buses(tmp_path, tls_files) as (a, b_url),
        user(a.url, "alice", tls_files),
        user(b_url, "bob", tls_files) as bob,
        connect(
            a.url + "/tube",
            ssl=client_ssl_context(tls_files),
            additional_headers={"Authorization": f"Bearer {a.other_credentials.token()}"},
        ) as other,
    ):
        assert (await _frame(other)).name == "asbp.tube"
        subject_id, _ = a.subjects["alice"]
        spoof = {"c": "chat", "r": "bob*b.test", "p": "alice*a.test"}
        # Knowing s is not enough: "other" did not sign alice in.
        await other.send(encode(Command({**spoof, "s": subject_id, "u": 3}, b"stolen")))
        fault = await _frame(other)
        assert (read_fault(fault).code, fault.command_id) == (FaultCode.ACCESS_DENIED, 3)
        # Without s there is no address to stamp p with (p written is never taken).
        await other.send(encode(Command({**spoof, "u": 4}, b"bare")))
        fault = await _frame(other)
        assert (read_fault(fault).code, fault.command_id) == (FaultCode.NO_ADDRESS, 4)
        with pytest.raises(FaultError) as invented:
            await a.signin.send_for("f" * 32, Command({**spoof, "u": 5}), confirm=5 * T)
        assert invented.value.code == FaultCode.ACCESS_DENIED
        with pytest.raises(ValueError, match="'r'"):
            await a.signin.send_for(subject_id, Command({"c": "chat"}))
        # None of the refused ones reached bob: the next Command he gets is this one.
        await a.signin.send_for(subject_id, Command({"c": "chat", "r": "bob*b.test"}, b"ok"))
        got = await bob.recv()
        assert (got.body, got.publisher) == (b"ok", "alice*a.test")


async def _frame(ws: ClientConnection) -> Command:
    data = await asyncio.wait_for(ws.recv(), 5 * T)
    return decode(data.encode() if isinstance(data, str) else data)
