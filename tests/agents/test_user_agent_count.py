"""How the SDK's WebSocket Channel counts for a resume: as the broker logs.

It opens every WebSocket with ``count=2``; a broker that will leave queue deliveries
out of the Channel's log says ``count=2`` back in its greeting, and then the SDK does
not count them. A broker that does not say it (here one whose Channels cannot resume,
as from one that predates ``count``) logs every frame, so the SDK counts every frame.
A lone broker (``memory``), real WebSockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import UserAgent
from agents.channel import WebSocketChannel
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig, ResumeMode
from tests.support import T, serve_app_async

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("resume", "counted"), [("on", False), ("off", True)])
async def test_a_queue_delivery_is_counted_unless_the_broker_said_count_2(
    tmp_path: Path, resume: ResumeMode, counted: bool
) -> None:
    config = GatewayConfig(data_dir=tmp_path, channels=ChannelLimits(resume=resume))
    async with serve_app_async(create_app(config)) as broker:
        transport = WebSocketChannel(broker.ws_url + "/asbp")
        ua = UserAgent(transport, reconnect=None)
        publisher = UserAgent.websocket(broker.ws_url + "/asbp", reconnect=None)
        async with ua, publisher:
            assert transport.counts_deliveries is counted
            await ua.subscribe("jobs", type="QUEUE")
            assert transport.received == 1  # the subscription's acceptance
            await publisher.request("asbp.publish", b"job", destination="jobs", type="QUEUE")
            delivered = await ua.receive(timeout=5 * T)
            assert (delivered.name, delivered.body) == ("asbp.notification", b"job")
            assert transport.received == 1 + counted
