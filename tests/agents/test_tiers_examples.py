"""The tier examples as real processes: a 3-tier and two 4-tier chains, faults through every tier.

* 3 tiers: examples/user_agent.py → examples/broker_agent.py (its Respondents).
* 4 tiers: examples/user_agent.py → broker A (``python -m gateway``) →
  examples/intermediary.py → broker B (``python -m gateway``) →
  examples/echo_agent.py.
* 3 tiers and onward: the SDK's UserAgent → examples/broker_agent.py, which
  serves ``echo`` itself and passes ``notes.*`` on to a second
  examples/broker_agent.py.
* 4 tiers with a Broker-Agent as the second broker: the SDK's UserAgent →
  broker A → examples/intermediary.py → examples/broker_agent.py, where a
  timeout (2103), an application's fault (2101) and the far process killed
  mid-stream (2102) each reach the sender with its own ``u``, and then the
  Intermediary withdraws its names so broker A answers 2101 itself.

Every process is stopped by its PID (tests/support/tiers.py).
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents import FaultError, UserAgent, generate_agent_key
from tests.support import T
from tests.support.tiers import Process, broker_process, example, running_process

pytestmark = pytest.mark.anyio


def write_key(directory: Path, identity: str) -> Path:
    """``<identity>.key`` here, ``<identity>.pem`` where the broker's config looks."""
    private, public = generate_agent_key()
    (directory / f"{identity}.pem").write_text(public)
    key = directory / f"{identity}.key"
    key.write_text(private)
    return key


@contextlib.asynccontextmanager
async def broker_agent(*args: str) -> AsyncIterator[tuple[Process, str]]:
    """examples/broker_agent.py on a free port; its Channel URL."""
    async with running_process([*example("broker_agent"), "--port", "0", *args], "ba") as ba:
        line = await ba.wait_line(lambda line: line.startswith("listening "))
        yield ba, line.split()[1]


@contextlib.asynccontextmanager
async def intermediary(
    upstream: str, downstream: str, key: Path, *args: str
) -> AsyncIterator[Process]:
    argv = [*example("intermediary"), "--upstream", upstream + "/tube", "--identity", "gate"]
    argv += ["--key-file", str(key), "--downstream", downstream, *args]
    async with running_process(argv, "intermediary") as process:
        await process.wait_line(lambda line: line.startswith("forwarding "))
        yield process


async def run_user_agent(url: str, *calls: str) -> tuple[int, list[str]]:
    argv = [*example("user_agent"), "--url", url, "--text", "hi"]
    for name in calls:
        argv += ["--call", name]
    async with running_process(argv, "user_agent") as client:
        code = await client.wait()
    return code, client.lines


def assert_chain_output(lines: list[str], fault: str) -> None:
    assert lines[0].startswith("channel "), lines
    assert lines[1] == "echo: hi", lines
    assert [line.split(": ")[0] for line in lines[2:5]] == ["clock 1/3", "clock 2/3", "clock 3/3"]
    assert re.fullmatch(r"missing u=\d+: fault " + re.escape(fault) + ".*", lines[5]), lines


async def test_three_tiers() -> None:
    async with broker_agent("--clock-interval", "0", "--broker-id", "shop") as (ba, url):
        code, lines = await run_user_agent(url, "missing", "notes.get")
        assert code == 1
        assert lines[0].endswith(" at broker shop")
        assert_chain_output(lines, "2101 (missing): no Command-Respondent serves 'missing'")
        assert re.fullmatch(r"notes.get u=\d+: fault 2101 \(notes.get\): no such note", lines[6])
        assert await ba.stop() == 0


async def test_four_tiers_through_two_brokers(tmp_path: Path) -> None:
    outer, inner = tmp_path / "a", tmp_path / "b"
    outer.mkdir()
    inner.mkdir()
    gate, echo = write_key(outer, "gate"), write_key(inner, "echo")
    async with (
        broker_process(outer, "broker-a", ["gate"]) as (_, url_a),
        broker_process(inner, "broker-b", ["echo"]) as (_, url_b),
    ):
        ws_a, ws_b = url_a.replace("http", "ws", 1), url_b.replace("http", "ws", 1)
        agent_args = ["--url", ws_b + "/tube", "--key-file", str(echo), "--clock-interval", "0"]
        async with running_process([*example("echo_agent"), *agent_args], "echo") as agent:
            await agent.wait_line(lambda line: line.startswith("serving echo and clock"))
            names = ["--name", "echo", "--name", "clock", "--name", "missing", "--channels", "2"]
            async with intermediary(ws_a, ws_b + "/asbp", gate, *names) as gateway:
                code, lines = await run_user_agent(ws_a + "/asbp", "missing")
                assert code == 1
                assert lines[0].endswith(" at broker broker-a")
                assert_chain_output(lines, "2101 (missing): no Command-Respondent serves")
                assert await gateway.stop() == 0
            assert await agent.stop() == 0


async def test_four_tiers_with_a_broker_agent_and_faults_from_every_tier(tmp_path: Path) -> None:
    gate = write_key(tmp_path, "gate")
    async with (
        broker_process(tmp_path, "broker-a", ["gate"]) as (_, url_a),
        broker_agent("--clock-interval", "3600") as (ba, url_ba),
    ):
        ws_a = url_a.replace("http", "ws", 1)
        names = ["--name", "notes.put", "--name", "notes.get", "--name", "clock"]
        async with (
            intermediary(ws_a, url_ba, gate, "--timeout", str(3 * T), *names) as gateway,
            UserAgent.websocket(ws_a + "/asbp") as ua,
        ):
            stored = await ua.request("notes.put", b"k=v", timeout=20 * T)
            assert stored.body == b"stored"
            assert (await ua.request("notes.get", b"k", timeout=20 * T)).body == b"v"
            # The Respondent's own fault, from the far tier.
            with pytest.raises(FaultError) as absent:
                await ua.request("notes.get", b"nothing", timeout=20 * T)
            assert (absent.value.code, absent.value.message) == (2101, "no such note")
            # A clock whose second tick never comes: the Intermediary's timeout, 2103.
            parts = ua.stream("clock", timeout=20 * T)
            assert (await anext(parts)).of_total == 1
            with pytest.raises(FaultError) as late:
                await anext(parts)
            assert late.value.code == 2103 and "from the next bus" in late.value.message
            await parts.aclose()
            # The far process killed mid-stream: 2102 to the sender, then 2101 while down.
            parts = ua.stream("clock", timeout=20 * T)
            assert (await anext(parts)).of_total == 1
            await ba.stop(signal.SIGKILL)
            with pytest.raises(FaultError) as left:
                await anext(parts)
            assert left.value.code == 2102 and left.value.cause == "clock"
            await parts.aclose()
            # With the next bus gone, the Intermediary withdraws its names at broker A,
            # so broker A itself answers that nobody serves them.
            await gateway.wait_line(lambda line: "intermediary: withdrew" in line)
            with pytest.raises(FaultError) as down:
                await ua.request("notes.get", b"k", timeout=20 * T)
            assert (down.value.code, down.value.cause) == (2101, "notes.get")
            assert down.value.message == "no Command-Respondent serves 'notes.get'"


async def test_a_broker_agent_that_passes_names_on_to_another() -> None:
    async with broker_agent("--broker-id", "back") as (_, back):
        forward = ["--forward", "notes.put", "--forward", "notes.get", "--downstream", back]
        async with (
            broker_agent("--broker-id", "front", *forward) as (process, front),
            UserAgent.websocket(front) as ua,
        ):
            echoed = await ua.request("echo", b"here", timeout=20 * T)
            assert (echoed.body, echoed.agent_id) == (b"here", "front")
            await process.wait_line(lambda line: "open at broker back" in line)
            stored = await ua.request("notes.put", b"k=v", timeout=20 * T)
            assert stored.body == b"stored"
            assert (await ua.request("notes.get", b"k", timeout=20 * T)).body == b"v"
            with pytest.raises(FaultError) as absent:
                await ua.request("notes.get", b"other", timeout=20 * T)
            assert (absent.value.code, absent.value.message) == (2101, "no such note")
