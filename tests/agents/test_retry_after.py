"""The SDK honours ``Retry-After`` (agents/retry_after.py).

A real broker (Hypercorn) with ``channels.max_handshakes = 1`` and that one
handshake held in flight by the probe (tests/support/gateway.py
``BrokerProbe.hold_websockets``): every other handshake, and every POST that
would open an HTTP Channel, is answered ``503`` with ``Retry-After: 1`` and
fault 2115. The User-Agent (WebSocket and HTTP) gets :class:`BrokerBusy` with
``retry_after`` 1; its reconnect loop and an Application-Agent's Tube wait at
least that second before the next attempt (before, their backoff of a few
hundredths of a second dialled straight back into the busy broker). An HTTP
Channel opened faster than ``http_opens_per_second`` gets 429 with the
``Retry-After`` the rate gives (fault 2108).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import logging
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import Backoff, BrokerBusy, ChannelEvent, ChannelEventKind, Reconnect, UserAgent
from agents.errors import FaultError
from agents.retry_after import (
    MAX_RETRY_AFTER,
    parse_retry_after,
    retry_after_of,
    wait_before,
)
from asbp import FaultCode
from gateway.app import create_app
from gateway.broker import Broker
from gateway.config.model import ChannelLimits
from tests.support import RunningServer, T, serve_app_async
from tests.support.agents import broker_config, install_echo, make_agent, make_credentials
from tests.support.gateway import BrokerProbe

pytestmark = pytest.mark.anyio

#: The backoff of these tests: far below the broker's Retry-After of 1 s.
FAST = Backoff(initial=0.01, maximum=0.02)
NOW = 1_000_000_000.0


# -- the header ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1", 1.0),
        (" 30 ", 30.0),
        ("0", 0.0),
        ("3600", MAX_RETRY_AFTER),  # capped: a wrong header cannot park an agent
        (email.utils.formatdate(NOW + 12, usegmt=True), 12.0),
        (email.utils.formatdate(NOW - 12, usegmt=True), 0.0),  # already past
        (email.utils.formatdate(NOW + 7200, usegmt=True), MAX_RETRY_AFTER),
        (None, None),
        ("", None),
        ("-1", None),
        ("1.5", None),  # RFC 9110: delay-seconds is whole
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00", None),  # no zone: not an HTTP date
        ("٣", None),  # a digit, but not ASCII
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=lambda: NOW) == seconds


def test_the_wait_is_retry_after_with_the_backoff_on_top() -> None:
    busy = BrokerBusy(2115, "busy", retry_after=1.0)
    assert wait_before(retry_after_of(busy), 0.25) == 1.25
    wrapped = ConnectionError("lost")
    wrapped.__cause__ = busy
    assert retry_after_of(wrapped) == 1.0
    assert retry_after_of(FaultError(2115, "no header")) is None
    assert retry_after_of(None) is None
    assert wait_before(None, 0.25) == 0.25
    assert isinstance(busy, FaultError) and busy.fault is FaultCode.BROKER_BUSY
    assert BrokerBusy.from_response(503, b"not asbp", 2.0, default=2115).code == 2115


# -- a real broker past its handshakes in flight ----------------------------------


@dataclasses.dataclass
class Busy:
    server: RunningServer
    probe: BrokerProbe

    @property
    def ws_url(self) -> str:
        return f"{self.server.ws_url}/asbp"

    @property
    def http_url(self) -> str:
        return f"{self.server.http_url}/asbp"

    @contextlib.asynccontextmanager
    async def full(self) -> AsyncIterator[None]:
        """The one handshake the broker serves at once, held in flight for the block."""
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def on_request(scope: MutableMapping[str, Any]) -> None:  # in the server's loop
            if scope["type"] == "websocket":
                loop.call_soon_threadsafe(arrived.set)

        await self.probe.hold_websockets(True)
        self.probe.on_request(on_request)

        async def dial() -> ClientConnection:
            return await connect(self.ws_url, open_timeout=30 * T)

        held = asyncio.create_task(dial())
        try:
            await asyncio.wait_for(arrived.wait(), 5 * T)
            self.probe.on_request(None)
            yield
        finally:
            await self.probe.hold_websockets(False)
            with contextlib.suppress(Exception):
                websocket = await asyncio.wait_for(held, 5 * T)
                await websocket.close()


@contextlib.asynccontextmanager
async def busy_broker(
    tmp_path: Path,
    *,
    opens_per_second: int = 20,
    identities: tuple[str, ...] = (),
    broker_id: str = "broker-a",
) -> AsyncIterator[Busy]:
    limits = ChannelLimits(max_handshakes=1, http_opens_per_second=opens_per_second)
    config = dataclasses.replace(broker_config(tmp_path, broker_id, identities), channels=limits)
    probe = BrokerProbe(create_app(config))
    async with serve_app_async(probe, server="hypercorn") as server:
        yield Busy(server, probe)


async def test_a_user_agent_turned_away_gets_the_retry_after(tmp_path: Path) -> None:
    async with busy_broker(tmp_path) as broker, broker.full():
        for agent in (
            UserAgent.websocket(broker.ws_url, timeout=5 * T, reconnect=None),
            UserAgent.http(broker.http_url, timeout=5 * T, reconnect=None),
        ):
            with pytest.raises(BrokerBusy) as info:
                await agent.connect()
            assert info.value.fault is FaultCode.BROKER_BUSY
            assert info.value.retry_after == 1.0
            await agent.close()


class Events:
    def __init__(self) -> None:
        self.seen: list[ChannelEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: ChannelEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    async def wait_for(self, kind: ChannelEventKind, attempt: int = 0) -> ChannelEvent:
        async with asyncio.timeout(10 * T):
            while True:
                for event in self.seen:
                    if event.kind is kind and event.attempt >= attempt:
                        return event
                self._changed.clear()
                await self._changed.wait()


async def test_the_reconnect_loop_waits_at_least_the_retry_after(tmp_path: Path) -> None:
    events = Events()
    async with busy_broker(tmp_path) as broker:
        agent = UserAgent.websocket(
            broker.ws_url, timeout=5 * T, reconnect=Reconnect(FAST), on_event=events
        )
        await agent.connect()
        try:
            async with broker.full():
                channel_id = agent.channel_id

                def drop(serving: Broker) -> None:
                    channel = serving.channels.get(channel_id)
                    assert channel is not None
                    serving.close_channel(channel)

                await broker.probe.call(drop)
                # The first attempt meets the 503; the next waits its Retry-After.
                second = await events.wait_for(ChannelEventKind.RECONNECTING, attempt=1)
                assert isinstance(second.error, BrokerBusy)
                assert second.error.retry_after == 1.0
                assert second.delay >= 1.0
                assert second.delay <= 1.0 + FAST.maximum
            # Once the broker has room, the next attempt opens a Channel.
            await events.wait_for(ChannelEventKind.RECONNECTED)
            assert agent.connected
        finally:
            await agent.close()


class _Delays(logging.Handler):
    """The delays a Tube says it waits before dialling again."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.delays: list[float] = []
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "tube %s: reconnecting in %.2f s":
            assert isinstance(record.args, tuple)
            delay = record.args[1]
            assert isinstance(delay, float)
            self.delays.append(delay)
            self.event.set()


async def test_a_tube_turned_away_waits_at_least_the_retry_after(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    async with busy_broker(tmp_path, identities=("echo",)) as broker:
        log = logging.getLogger("tests.agents.retry_after")
        log.setLevel(logging.INFO)
        delays = _Delays()
        log.addHandler(delays)
        agent = make_agent(credentials, [f"{broker.server.ws_url}/tube"], backoff=FAST, logger=log)
        install_echo(agent)
        try:
            async with broker.full():
                await agent.start()
                await asyncio.wait_for(delays.event.wait(), 10 * T)
                assert delays.delays[0] >= 1.0
            await agent.wait_registered(10 * T)
        finally:
            await agent.close()
            log.removeHandler(delays)


async def test_an_http_channel_past_the_open_rate_gets_its_retry_after(tmp_path: Path) -> None:
    async with busy_broker(tmp_path, opens_per_second=1) as broker:
        first = UserAgent.http(broker.http_url, timeout=5 * T, reconnect=None)
        await first.connect()
        second = UserAgent.http(broker.http_url, timeout=5 * T, reconnect=None)
        try:
            with pytest.raises(BrokerBusy) as info:
                await second.connect()
            assert info.value.fault is FaultCode.TOO_MANY_CHANNELS
            assert info.value.retry_after == 1.0
        finally:
            await second.close()
            await first.close()


async def test_a_websocket_user_agent_turned_away_opens_at_the_next_broker(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        busy_broker(tmp_path / "a") as busy,
        busy_broker(tmp_path / "b", broker_id="broker-b") as free,
        busy.full(),
    ):
        agent = UserAgent.websocket([busy.ws_url, free.ws_url], timeout=5 * T, reconnect=None)
        try:
            await agent.connect()  # the busy one's 503 is one more URL not reachable
            assert agent.connected
            assert agent.broker_id == "broker-b"
        finally:
            await agent.close()
