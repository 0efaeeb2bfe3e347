"""/console in headless Chromium (Debian's chromium, driven by playwright-core from
this folder's package.json): it loads against a broker with traffic, a chart
updates, peeking into a queue lists its messages, purging a queue from the
console empties it, and a queue's dead letters are moved back with its button.
The Node script writes a screenshot under the test's temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path

import pytest

from asbp import Command
from gateway.config.model import MessagingLimits
from tests.support import T
from tests.support.gateway import GatewayFactory
from tests.support.messaging import Messenger, user

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "console.mjs"

pytestmark = pytest.mark.anyio


def test_the_browser_tools_are_installed() -> None:
    # Said plainly rather than as a Node stack trace: scripts/test installs both.
    assert shutil.which("node"), "node is required (apt-get install nodejs npm)"
    assert Path("/usr/bin/chromium").exists(), "apt-get install chromium"
    assert (HERE / "node_modules" / "playwright-core").is_dir(), (
        "npm ci --prefix tests/gateway/console"
    )


async def test_the_console_charts_traffic_and_purges_a_queue(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway(messaging=MessagingLimits(max_deliveries=1))
    await gateway.tube("billing", serves=("quote",))
    publisher = await user(gateway)
    for n in range(3):
        await publisher.publish("jobs", b"job %d" % n, type="QUEUE")
    # A dead letter in "mail": polled once (its one delivery), then its Channel closed.
    await publisher.publish("mail", b"bounced", type="QUEUE", notice="dequeued")
    peer = await gateway.channel()
    polled = await Messenger.of(peer).ok("asbp.poll", destination="mail", type="QUEUE")
    assert polled.get("count") == "1"
    await peer.close()
    assert (await publisher.take("asbp.notice")).get("reason") == "discarded"
    channel = await gateway.channel()
    stop = asyncio.Event()

    async def traffic() -> None:
        # Commands while the console watches, so its Commands/s chart has data.
        u = 0
        while not stop.is_set():
            u += 1
            await channel.request(Command(c="nobody.serves", u=u % 60000))
            # Paced, not synchronised: a steady trickle until the browser is done.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    screenshot = tmp_path / "console.png"
    background = asyncio.create_task(traffic())
    try:
        process = await asyncio.create_subprocess_exec(
            "node",
            str(SCRIPT),
            gateway.server.http_url,
            "jobs",
            str(screenshot),
            "mail",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=HERE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60 * T)
    finally:
        stop.set()
        await background
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["before"] == 3
    assert result["peeked"] == ["job 0", "job 1", "job 2"]
    assert (result["deadBefore"], result["deadDepth"]) == (1, 1)
    assert (result["agents"], result["brokers"]) == (1, 1)
    assert screenshot.stat().st_size > 0
    depths = await gateway.call(lambda broker: broker.engine.depths())
    assert (await depths)["jobs"] == 0
    stats = await (await gateway.call(lambda broker: broker.engine.queue_stats("mail")))
    assert (stats.depth, stats.dead_letters) == (1, 0)
