"""Rolling restarts and scale-down lose nothing (gateway.drain; docs/kubernetes.md).

Three ``python -m gateway`` processes on one private redis-server, each on a
port of its own that it keeps across restarts; an echo Application-Agent (the
SDK's) with a Tube to each; :data:`CHANNELS` WebSocket Channels spread over the
three, each sending numbered Commands one after another for as long as the test
runs. The User-Agents are a light client (:class:`Sender`: a plain
``websockets`` connection that counts the frames it got and resumes with that
count, as the SDK's ``WebSocketChannel`` does), not the SDK's ``UserAgent``: a
thousand of those and their tasks are more than two cores carry beside three
brokers (and the SDK's ``UserAgent`` fails what it awaits on a loss, where this
client must see every answer). Whenever its connection ends, a Sender resumes
its Channel at the next broker of the list at once and sends again only what
the stopping broker says it did not read (``read=<n>`` in the close reason,
docs/protocol.md): every answer must come, replayed from the log or routed
live, exactly once and in order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from asbp import Command, decode, encode
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, T, listen_port
from tests.support.agents import install_echo, make_agent, make_credentials
from tests.support.bus import flush, until_in_directory

pytestmark = pytest.mark.anyio

#: WebSocket Channels exchanging Commands while every broker restarts in turn.
CHANNELS = 1000
BROKERS = ("broker-a", "broker-b", "broker-c")
#: The default lease. Not shorter: two cores carrying three brokers, the agent and a
#: thousand Channels stall a broker's loop for long enough that a short lease runs
#: out while it still serves, and the others then sweep it as a crashed broker
#: (what it read but had not yet trimmed from its inbound stream is saved into the
#: logs a second time, and requests waiting there are dropped): a crash's
#: at-least-once, not this test's subject.
LEASE = 10.0
#: The brokers' drain time: well past what an echo takes, short for the test.
DRAIN = 3.0
#: Answers the whole bus must give between two restarts (the load really runs).
PROGRESS = 2000


@dataclass
class Tally:
    """What all the Senders did, and a way to wait for the bus to make progress."""

    answered: int = 0
    resumed: int = 0
    sent_again: int = 0
    closes: collections.Counter[int | None] = field(default_factory=collections.Counter)
    faults: list[str] = field(default_factory=list)
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def answer(self) -> None:
        self.answered += 1
        self.moved.set()

    async def until(self, answered: int) -> None:
        with anyio.fail_after(30 * T):
            while self.answered < answered:
                self.moved.clear()
                await self.moved.wait()


class Sender:
    """One Channel: sends ``echo`` with ``u`` 1, 2, 3, ..., the next once the last
    is answered; resumes elsewhere whenever its connection ends."""

    def __init__(self, index: int, urls: list[str], tally: Tally) -> None:
        self._urls = urls
        self._at = index % len(urls)
        self._tally = tally
        self.channel_id = ""
        self._secret = ""
        self._received = 0
        self.sent = 0
        self.answers: list[int] = []
        self._connection: ClientConnection | None = None

    async def open(self) -> None:
        connection = await connect(self._urls[self._at], compression=None, max_size=None)
        greeting = decode(_bytes(await connection.recv()))
        assert greeting.name == "asbp.channel", greeting
        self.channel_id = str(greeting.get("i"))
        self._secret = str(greeting.get("secret"))
        self._connection = connection

    async def run(self, stop: asyncio.Event) -> None:
        waiting = False
        #: Frames sent on this connection (the close of a stopping broker says how
        #: many it routed: the rest are sent again after the resume).
        sent_here = 0
        again = False
        while True:
            connection = self._connection
            assert connection is not None
            try:
                if not waiting or again:
                    if not waiting:
                        if stop.is_set():
                            await connection.close()
                            return
                        self.sent += 1
                        waiting = True
                    again = False
                    # Counted first: a send that fails may or may not have left.
                    sent_here += 1
                    await connection.send(encode(Command({"c": "echo", "u": self.sent}, b"x")))
                try:
                    with anyio.fail_after(20 * T):
                        frame = await connection.recv()
                except TimeoutError:
                    # Lost: said in the report, which the assertions then refuse.
                    self._tally.faults.append(f"{self.channel_id}: no answer to {self.sent}")
                    return
                self._received += 1
                command = decode(_bytes(frame))
                if command.name == "asbp.fault":
                    self._tally.faults.append(f"{self.channel_id}: {command.body.decode()}")
                    continue
                self.answers.append(int(command.command_id or 0))
                self._tally.answer()
                waiting = self.answers[-1] != self.sent
            except ConnectionClosed as closed:
                self._tally.closes[closed.rcvd.code if closed.rcvd is not None else None] += 1
                reason = closed.rcvd.reason if closed.rcvd is not None else ""
                read = reason.rpartition("; read=")[2]
                # The one frame awaiting its answer was the last sent here: unread,
                # it is sent again (docs/protocol.md, "A broker that stops").
                again = waiting and read.isdigit() and int(read) < sent_here
                self._tally.sent_again += again
                await self._resume()
                sent_here = 0

    async def _resume(self) -> None:
        """At the next broker that answers; none of them sleeps: a stopped broker
        refuses the connection at once, and at most one is down at a time."""
        with anyio.fail_after(30 * T):
            while True:
                self._at = (self._at + 1) % len(self._urls)
                url = self._urls[self._at] + "?resume=" + self.channel_id
                try:
                    connection = await connect(url, compression=None, max_size=None)
                except (OSError, InvalidHandshake):
                    continue
                try:
                    await connection.send(
                        f"c=asbp.resume,i={self.channel_id},secret={self._secret},"
                        f"received={self._received};"
                    )
                    answer = decode(_bytes(await connection.recv()))
                except ConnectionClosed:
                    continue  # that broker is stopping: the next one
                if answer.name != "asbp.resumed":
                    self._tally.faults.append(f"{self.channel_id}: resume: {answer!r}")
                    await connection.close()
                    continue
                assert answer.get("received") == str(self._received), answer
                self._tally.resumed += 1
                self._connection = connection
                return


def _bytes(frame: str | bytes) -> bytes:
    return frame.encode() if isinstance(frame, str) else frame


@dataclass
class Bus:
    """The three brokers, each restartable on its own port."""

    redis_url: str
    directory: Path
    settings: str
    ports: dict[str, int]
    stack: contextlib.AsyncExitStack
    running: dict[str, BrokerProcess] = field(default_factory=dict)
    lives: collections.Counter[str] = field(default_factory=collections.Counter)

    async def start(self, broker_id: str) -> BrokerProcess:
        self.lives[broker_id] += 1
        process = await self.stack.enter_async_context(
            broker_process(
                self.redis_url,
                self.directory / f"{broker_id}-{self.lives[broker_id]}",
                ack_timeout=30,
                prefetch=8,
                settings=f'broker_id = "{broker_id}"\n{self.settings}',
                port=self.ports[broker_id],
            )
        )
        self.running[broker_id] = process
        return process

    async def stop(self, broker_id: str) -> int:
        """SIGTERM, as Kubernetes sends; the exit status once it is gone."""
        process = self.running.pop(broker_id).process
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30 * T):
            return await process.wait()

    def urls(self) -> list[str]:
        return [f"ws://127.0.0.1:{self.ports[b]}/asbp" for b in BROKERS]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("rollout-redis")) as server:
        yield server


@contextlib.asynccontextmanager
async def loaded_bus(
    tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[tuple[Bus, Tally, list[Sender], asyncio.Event]]:
    """Three brokers, the echo agent on each, and :data:`CHANNELS` Senders sending.

    On the way out the Senders stop (each after its last answer) and are awaited.
    """
    await flush(redis_server.url)
    credentials = make_credentials(tmp_path, "echo")
    settings = (
        f"bus_lease = {LEASE}\ndrain_timeout = {DRAIN}\ninsecure_dev_tubes = true\n"
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
    )
    ports = {broker_id: listen_port("127.0.0.1") for broker_id in BROKERS}
    async with contextlib.AsyncExitStack() as stack:
        bus = Bus(redis_server.url, tmp_path, settings, ports, stack)
        for broker_id in BROKERS:
            await bus.start(broker_id)
        tubes = [url.replace("/asbp", "/tube") for url in bus.urls()]
        agent = make_agent(credentials, tubes)
        install_echo(agent)
        await stack.enter_async_context(agent)
        for broker_id in BROKERS:
            await until_in_directory(bus.redis_url, "name:echo", broker_id)
        tally = Tally()
        senders = [Sender(index, bus.urls(), tally) for index in range(CHANNELS)]
        for start in range(0, CHANNELS, 100):
            await asyncio.gather(*(sender.open() for sender in senders[start : start + 100]))
        stop = asyncio.Event()
        async with anyio.create_task_group() as group:
            for sender in senders:
                group.start_soon(sender.run, stop)
            try:
                yield bus, tally, senders, stop
            finally:
                stop.set()


async def back_in_service(bus: Bus, broker_id: str) -> None:
    """Started again on its port, and its echo agent's Tube there registered."""
    await bus.start(broker_id)
    # The agent dials the restarted broker again after its backoff, in a test process
    # driving a thousand Channels: longer than a lone registration takes.
    await until_in_directory(bus.redis_url, "name:echo", broker_id, timeout=30 * T)


def report(title: str, tally: Tally, senders: list[Sender]) -> tuple[int, int, int]:
    """Print the counts (the closing note quotes them); (sent, answered, wrong)."""
    sent = sum(sender.sent for sender in senders)
    answered = sum(len(sender.answers) for sender in senders)
    wrong = [s for s in senders if s.answers != list(range(1, s.sent + 1))]
    duplicates = sum(len(s.answers) - len(set(s.answers)) for s in senders)
    print(
        f"\n{title}: {len(senders)} Channels, {sent} Commands sent, {answered} answered,"
        f" {duplicates} duplicates, {len(wrong)} Channels out of order or short;"
        f" {tally.resumed} resumes ({tally.sent_again} Commands the stopping broker had"
        " not read sent again),"
        f" closes by code {dict(tally.closes)},"
        f" {len(tally.faults)} faults"
    )
    return sent, answered, len(wrong)


async def test_a_rollout_of_every_broker_loses_and_duplicates_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with loaded_bus(tmp_path, redis_server) as (bus, tally, senders, stop):
        await tally.until(PROGRESS)
        for broker_id in BROKERS:
            assert await bus.stop(broker_id) == 0
            await back_in_service(bus, broker_id)
            await tally.until(tally.answered + PROGRESS)
        stop.set()
    sent, answered, wrong = report("rollout", tally, senders)
    assert tally.faults == []
    assert (answered, wrong) == (sent, 0)
    # Every Channel moved at least once (each was on a broker that restarted), and
    # each was told to resume elsewhere: 1012, never a drop.
    assert tally.resumed >= CHANNELS
    assert set(tally.closes) == {1012}


async def test_a_scale_down_loses_and_duplicates_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with loaded_bus(tmp_path, redis_server) as (bus, tally, senders, stop):
        await tally.until(PROGRESS)
        # broker-c goes for good: its Channels carry on at the other two.
        assert await bus.stop("broker-c") == 0
        await tally.until(tally.answered + PROGRESS)
        stop.set()
    sent, answered, wrong = report("scale-down", tally, senders)
    assert tally.faults == []
    assert (answered, wrong) == (sent, 0)
    assert set(tally.closes) == {1012}
