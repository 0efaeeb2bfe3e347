"""The examples run end to end against a real broker, in-process and as scripts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import io
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest

from agents import FaultError, UserAgent, generate_agent_key
from gateway.app import create_app
from tests.support import RunningServer, T, serve_app_async
from tests.support.agents import broker_config, running_broker

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


echo_agent = load("echo_agent")
user_agent = load("user_agent")


def write_key(tmp_path: Path) -> Path:
    """The echo agent's private key on disk, its public key where the broker looks."""
    private, public = generate_agent_key()
    (tmp_path / "echo.pem").write_text(public)
    path = tmp_path / "echo.key"
    path.write_text(private)
    return path


@contextlib.asynccontextmanager
async def echo_agent_running(server: RunningServer, key_file: Path) -> AsyncIterator[None]:
    """``examples/echo_agent.py``'s ``main()`` serving ``server`` until the block ends."""
    stop, ready = asyncio.Event(), asyncio.Event()
    argv = ["--url", server.ws_url + "/tube", "--key-file", str(key_file), "--clock-interval", "0"]
    agent = asyncio.create_task(echo_agent.main(argv, stop=stop, ready=ready))
    readiness = asyncio.create_task(ready.wait())
    try:
        await asyncio.wait({agent, readiness}, timeout=10 * T, return_when="FIRST_COMPLETED")
        if not ready.is_set():
            if agent.done():
                agent.result()  # raises what main() raised
            raise TimeoutError("the echo agent did not register in time")
        yield
    finally:
        readiness.cancel()
        stop.set()
        async with asyncio.timeout(10 * T):
            assert await agent == 0


@pytest.mark.parametrize("scheme", ["ws", "http"])
async def test_both_examples_in_process(tmp_path: Path, scheme: str) -> None:
    key_file = write_key(tmp_path)
    async with running_broker(tmp_path) as server, echo_agent_running(server, key_file):
        out = io.StringIO()
        url = (server.ws_url if scheme == "ws" else server.http_url) + "/asbp"
        status = await user_agent.main(["--url", url, "--text", "hi there"], out=out)
        assert status == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("channel ") and lines[0].endswith(" at broker broker-a")
    assert lines[1] == "echo: hi there"
    assert [line.split(": ")[0] for line in lines[2:]] == ["clock 1/3", "clock 2/3", "clock 3/3"]


async def test_user_agent_reports_a_fault(tmp_path: Path) -> None:
    write_key(tmp_path)  # the broker needs the agent's public key, though no agent comes
    async with running_broker(tmp_path) as server:
        out = io.StringIO()
        status = await user_agent.main(["--url", server.ws_url + "/asbp"], out=out)
    assert status == 1
    assert "fault 2101 (echo)" in out.getvalue()


async def test_both_examples_as_scripts(tmp_path: Path) -> None:
    key_file = write_key(tmp_path)
    async with running_broker(tmp_path) as server:
        env = {
            **os.environ,
            "ASBP_TUBE_URLS": server.ws_url + "/tube",
            "ASBP_AGENT_KEY_FILE": str(key_file),
            "ASBP_URL": server.ws_url + "/asbp",
        }
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / "echo_agent.py"),
            "--clock-interval",
            "0",
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert agent.stderr is not None
            log: list[bytes] = []
            async with asyncio.timeout(20 * T):
                while not log or not log[-1].startswith(b"serving echo and clock at "):
                    line = await agent.stderr.readline()
                    assert line, b"".join(log)  # EOF: the agent died
                    log.append(line)

            client = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLES / "user_agent.py"),
                "--text",
                "from a script",
                env=env,
                stdout=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(20 * T):
                stdout, _ = await client.communicate()
            assert client.returncode == 0
            assert b"echo: from a script\n" in stdout
            assert stdout.count(b"clock ") == 3

            agent.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20 * T):
                rest = await agent.stderr.read()
                await agent.wait()
            assert agent.returncode == 0, rest
            assert b"no longer serving ['clock', 'echo']" in rest
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()


def test_the_demo_runs_the_example_byte_for_byte() -> None:
    # `asbp demo` runs the packaged copy (an installed package has no examples/);
    # people read examples/echo_agent.py. Edit one, copy it over the other.
    packaged = Path(__file__).resolve().parents[2] / "agents" / "examples" / "echo_agent.py"
    assert packaged.read_bytes() == (EXAMPLES / "echo_agent.py").read_bytes()


async def test_the_example_agent_signs_subjects_in_with_the_sdk_helpers(tmp_path: Path) -> None:
    # Request.authenticate and Request.refuse, as the demo page uses them.
    key_file = write_key(tmp_path)
    config = broker_config(tmp_path)
    config = dataclasses.replace(
        config,
        authenticate_command="auth.login",
        agents={
            "echo": {
                "public_key": "echo.pem",
                "serves": ["echo", "clock", "whoami", "auth\\.login"],
            }
        },
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    async with serve_app_async(create_app(config)) as server:
        argv = ["--url", server.ws_url + "/tube", "--key-file", str(key_file)]
        agent = asyncio.create_task(
            echo_agent.main([*argv, "--sign-in", "auth.login"], stop=stop, ready=ready)
        )
        try:
            async with asyncio.timeout(10 * T):
                await ready.wait()
            async with UserAgent.websocket(server.ws_url + "/asbp") as user:
                alice = await user.request("auth.login", "alice", timeout=10 * T)
                assert alice.name == "asbp.authenticated"
                assert alice.get("roles") in ("user", ("user",))
                assert alice.get("p") == "alice*demo"
                bob = await user.request("auth.login", "bob", timeout=10 * T)
                assert bob.subject_id != alice.subject_id
                for answer, name in ((alice, "alice"), (bob, "bob")):
                    subject = answer.subject_id
                    assert subject is not None
                    reply = await user.request("whoami", timeout=10 * T, s=subject)
                    assert reply.body == name.encode()
                assert (await user.request("whoami", timeout=10 * T)).body == b"anonymous"
                with pytest.raises(FaultError) as refused:
                    await user.request("auth.login", "Not A Name!", timeout=10 * T)
                assert refused.value.code == 3101
                assert "is not a user name" in str(refused.value)
        finally:
            stop.set()
            async with asyncio.timeout(10 * T):
                assert await agent == 0
