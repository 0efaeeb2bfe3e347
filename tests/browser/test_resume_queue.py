"""The TypeScript client in Chromium resumes across a queue delivery (``count=2``).

A lone broker (the ``memory`` engine, ``resume = "on"``, the demo page on, for the
bundle) behind a TCP proxy the test cuts; the page is loaded through the proxy, so its
WebSocket is the broker's own origin. agents/js/test/browser/resume-queue.mjs drives
Chromium: its Client gets a queue delivery and never acknowledges it; the test cuts the
connection, an Application-Agent routes "away" to the Channel while it is away, and
the Client resumes: "away" arrives once (its count, without the delivery, agrees with
the log, which left the delivery out) and the job comes again from its queue.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asbp import Command
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.support import T, serve_app_async
from tests.support.agents import TcpProxy, make_agent, make_credentials
from tests.support.js import built_client, node

pytestmark = pytest.mark.anyio


async def test_the_bundle_resumes_across_a_queue_delivery_in_chromium(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path, "news")
    config = GatewayConfig(
        data_dir=tmp_path,
        insecure_dev_tubes=True,
        agents={"news": {"public_key": "news.pem"}},
        agents_base_dir=tmp_path,
        channels=ChannelLimits(resume="on"),
        demo_page=True,
    )
    async with serve_app_async(create_app(config)) as broker, TcpProxy() as proxy:
        proxy.target = broker.port
        agent = make_agent(credentials, [broker.ws_url + "/tube"])
        async with agent:
            await agent.wait_registered(5 * T)
            script = await asyncio.create_subprocess_exec(
                node(),
                "test/browser/resume-queue.mjs",
                f"http://127.0.0.1:{proxy.port}",
                cwd=built_client(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                assert script.stdout is not None and script.stdin is not None
                async with asyncio.timeout(60 * T):
                    line = (await script.stdout.readline()).decode().strip()
                if not line.startswith("channel "):
                    out, err = await script.communicate()
                    raise AssertionError(f"{line}\n{out.decode()}\n{err.decode()}")
                channel_id = line.removeprefix("channel ")
                proxy.cut()
                await agent.send(Command({"c": "news", "d": channel_id}, b"away"))
                # Answered on the same Tube after "away" was routed (into the log).
                await agent.ping()
                proxy.target = broker.port
                script.stdin.write(b"resume\n")
                await script.stdin.drain()
                script.stdin.close()  # and Node, done, exits (an open stdin keeps it)
                async with asyncio.timeout(60 * T):
                    out, err = await script.communicate()
                assert script.returncode == 0 and out.decode().strip().endswith("ok"), (
                    f"{out.decode()}\n{err.decode()}"
                )
            finally:
                if script.returncode is None:
                    script.kill()
                    await script.wait()
