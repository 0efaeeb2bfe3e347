"""A StreamOutbox and its writer: frames offered while the writer waits skip its wake-up.

The writer here is the real ``_write`` of gateway.transports.websocket with an ASGI
``send`` that records what it is given and from which task. A frame handed over by the
outbox runs ``send`` from a plain callback (no task); the writer's own sends run in the
writer task. Real servers drive the same path in test_backpressure (a send that
suspends because the reader stopped reading) and everywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest

from asbp import ApplicationAgentId
from gateway.connections.outboxes import Mailbox, StreamOutbox
from gateway.connections.tubes import Tube
from gateway.transports.websocket import _finish, _write
from tests.support import T

pytestmark = pytest.mark.anyio

Hook = Callable[[bytes], Awaitable[None]]


class Recorder:
    """An ASGI ``send``: each frame, and the task that sent it (None: a callback)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, asyncio.Task[Any] | None]] = []
        self.closed = asyncio.Event()
        self.hooks: dict[bytes, Hook] = {}
        self._wanted = 0
        self._arrived = asyncio.Event()

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "websocket.close":
            self.closed.set()
            return
        frame = message["bytes"]
        hook = self.hooks.pop(frame, None)
        if hook is not None:
            await hook(frame)
        self.sent.append((frame, asyncio.current_task()))
        if len(self.sent) >= self._wanted:
            self._arrived.set()

    async def wait_for(self, count: int) -> None:
        """Until ``count`` frames were sent."""
        self._wanted = count
        if len(self.sent) < count:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), 5 * T)

    def frames(self) -> list[bytes]:
        return [frame for frame, _ in self.sent]


@contextlib.asynccontextmanager
async def writer(outbox: StreamOutbox, send: Recorder) -> Any:
    """Run ``_write``; it has sent ``b"first"`` and waits for frames when this yields."""
    outbox.offer(b"first")
    task = asyncio.create_task(_write(outbox, send, Tube(ApplicationAgentId("agent"), outbox)))
    try:
        # The writer took b"first", sent it without suspending, and went back to take().
        await send.wait_for(1)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_frames_offered_while_the_writer_waits_are_sent_without_waking_it() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    async with writer(outbox, send) as task:
        assert send.sent == [(b"first", task)]
        for frame in (b"a", b"b", b"c"):  # one turn of the loop: sent together, in order
            assert outbox.offer(frame)
        await send.wait_for(4)
        assert send.sent[1:] == [(b"a", None), (b"b", None), (b"c", None)]
        outbox.close()
        await asyncio.wait_for(send.closed.wait(), 5 * T)
        await asyncio.wait_for(task, 5 * T)


async def test_frames_offered_as_the_outbox_closes_are_left_to_the_writer() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    async with writer(outbox, send) as task:
        outbox.offer(b"last")
        outbox.close()  # wakes the writer before the outbox hands b"last" over
        await asyncio.wait_for(send.closed.wait(), 5 * T)
        assert send.sent[1:] == [(b"last", task)]


async def test_without_send_directly_a_frame_wakes_the_taker() -> None:
    outbox = StreamOutbox(16, 1 << 20)
    taken = asyncio.create_task(outbox.take())
    await _one_turn()  # it waits for frames
    outbox.offer(b"a")
    outbox.offer(b"b")
    assert await asyncio.wait_for(taken, 5 * T) == [b"a", b"b"]


async def test_a_send_that_suspends_holds_back_later_frames_until_it_is_done() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()

    async def wait_for_gate(frame: bytes) -> None:
        entered.set()
        await gate

    send.hooks[b"slow"] = wait_for_gate
    async with writer(outbox, send) as task:
        outbox.offer(b"slow")
        await asyncio.wait_for(entered.wait(), 5 * T)  # its send waits for gate
        outbox.offer(b"next")
        outbox.offer(b"last")
        gate.set_result(None)
        await send.wait_for(4)
        # A send records its frame once it is done: b"next" did not overtake b"slow".
        assert send.frames() == [b"first", b"slow", b"next", b"last"]
        assert send.sent[2][1] is task  # the writer sent what waited


async def test_a_send_that_yields_once_is_finished_in_order() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()

    async def yield_once(frame: bytes) -> None:
        await asyncio.sleep(0)

    send.hooks[b"a"] = yield_once
    async with writer(outbox, send):
        outbox.offer(b"a")
        await send.wait_for(2)
        outbox.offer(b"b")
        await send.wait_for(3)
        assert send.frames() == [b"first", b"a", b"b"]


async def test_a_send_that_fails_at_once_is_left_to_the_writer() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    failures: list[bytes] = []

    async def fail_once(frame: bytes) -> None:
        failures.append(frame)
        raise RuntimeError("not from here")

    send.hooks[b"flaky"] = fail_once
    async with writer(outbox, send) as task:
        outbox.offer(b"flaky")
        outbox.offer(b"after")
        await send.wait_for(3)
        # The writer sent b"flaky" again (its hook was used up) and then the rest.
        assert failures == [b"flaky"]
        assert send.sent[1:] == [(b"flaky", task), (b"after", task)]
        outbox.offer(b"later")  # the writer keeps sending by itself from then on
        await send.wait_for(4)
        assert send.sent[3] == (b"later", task)


async def test_cancelling_the_writer_cancels_a_suspended_send() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()

    async def wait_for_gate(frame: bytes) -> None:
        entered.set()
        try:
            await gate
        except asyncio.CancelledError:
            outcome.set_result("cancelled")
            raise

    send.hooks[b"slow"] = wait_for_gate
    async with writer(outbox, send) as task:
        outbox.offer(b"slow")
        await asyncio.wait_for(entered.wait(), 5 * T)
        task.cancel()  # as channel_endpoint does when the peer has gone
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await asyncio.wait_for(outcome, 5 * T) == "cancelled"
    assert send.frames() == [b"first"]


async def test_a_suspended_send_that_fails_ends_the_writer_quietly() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()

    async def peer_gone(frame: bytes) -> None:
        entered.set()
        await gate
        raise ConnectionResetError("the peer has gone")

    send.hooks[b"slow"] = peer_gone
    async with writer(outbox, send) as task:
        outbox.offer(b"slow")
        await asyncio.wait_for(entered.wait(), 5 * T)
        gate.set_result(None)
        outbox.offer(b"next")  # wakes the writer, which meets the failure and stops
        await asyncio.wait_for(task, 5 * T)
    assert send.frames() == [b"first"]


async def test_a_writer_cancelled_after_a_suspended_send_finished() -> None:
    outbox, send = StreamOutbox(16, 1 << 20), Recorder()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait_for_gate(frame: bytes) -> None:
        await gate

    send.hooks[b"slow"] = wait_for_gate
    async with writer(outbox, send):
        outbox.offer(b"slow")
        gate.set_result(None)
        await send.wait_for(2)  # sent by the task that finished it; the writer never woke
    assert send.frames() == [b"first", b"slow"]


async def _one_turn() -> None:
    """Let a task created just before run its first step.

    Not a sleep to wait for something to happen: asyncio runs callbacks in the order
    they were scheduled, so the new task's first step, scheduled first, runs before
    this task resumes.
    """
    await asyncio.sleep(0)


def _started(awaitable: Awaitable[Any]) -> tuple[Any, Any]:
    """Run an awaitable's first step here, outside any task, as ``send_now`` does."""
    steps = awaitable.__await__()
    return steps, steps.send(None)


async def _gated(gate: asyncio.Future[str], seen: list[str]) -> None:
    try:
        seen.append(await gate)
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    except LookupError as exc:
        seen.append(f"raised {exc}")


@pytest.mark.parametrize(
    ("settle", "seen"),
    [
        (lambda gate: gate.set_result("opened"), ["opened"]),
        (lambda gate: gate.set_exception(LookupError("boom")), ["raised boom"]),
        (lambda gate: gate.cancel(), ["cancelled"]),
    ],
)
async def test_finish_hands_the_future_s_outcome_to_the_awaitable(
    settle: Callable[[asyncio.Future[str]], object], seen: list[str]
) -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    got: list[str] = []
    steps, waiting_on = _started(_gated(gate, got))
    assert waiting_on is gate
    task = asyncio.create_task(_finish(steps, waiting_on))
    await _one_turn()  # the task waits for gate
    settle(gate)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 5 * T)
    assert got == seen


async def test_finish_throws_its_own_cancellation_into_the_awaitable() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    got: list[str] = []
    steps, waiting_on = _started(_gated(gate, got))
    task = asyncio.create_task(_finish(steps, waiting_on))
    await _one_turn()  # the task waits for gate
    # gate is done before the task resumes, so its cancellation cannot travel through
    # gate: it is raised in the task, which throws it into the awaitable.
    gate.set_result("opened")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5 * T)
    assert got == ["cancelled"]


@pytest.mark.parametrize("tidy_up", [False, True])
async def test_finish_goes_on_when_the_awaitable_handles_what_is_thrown(tidy_up: bool) -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def give_up(gate: asyncio.Future[str]) -> str:
        try:
            return await gate
        except asyncio.CancelledError:
            if tidy_up:  # one more suspension, which _finish sees through too
                await asyncio.sleep(0)
            return "gave up"

    steps, waiting_on = _started(give_up(gate))
    task = asyncio.create_task(_finish(steps, waiting_on))
    await _one_turn()  # the task waits for gate
    gate.set_result("opened")
    task.cancel()
    await asyncio.wait_for(task, 5 * T)  # the awaitable returned: the task did too


async def test_finish_resumes_a_bare_yield() -> None:
    async def yield_once() -> str:
        await asyncio.sleep(0)
        return "done"

    steps, waiting_on = _started(yield_once())
    assert waiting_on is None
    await asyncio.wait_for(_finish(steps, waiting_on), 5 * T)


@pytest.mark.parametrize("kind", [StreamOutbox, Mailbox])
def test_room_is_what_offer_still_takes(kind: type[StreamOutbox] | type[Mailbox]) -> None:
    outbox = kind(3, 100)
    assert outbox.room() == (3, sys.maxsize)  # empty: one frame of any size fits
    assert outbox.offer(b"x" * 60)
    assert outbox.room() == (2, 40)
    assert not outbox.offer(b"y" * 41)  # one byte more than room() said
    assert outbox.offer(b"y" * 40)
    assert outbox.room() == (1, 0)
    assert outbox.offer(b"")
    assert outbox.room() == (0, 0)
    assert not outbox.offer(b"")
    outbox.close()
    assert outbox.room() == (0, 0)


def test_a_closed_empty_outbox_has_no_room() -> None:
    for outbox in (StreamOutbox(3, 100), Mailbox(3, 100)):
        outbox.close()
        assert outbox.room() == (0, 0)
        assert not outbox.offer(b"late")


@pytest.mark.anyio
async def test_when_drained_fires_once_when_a_stream_outbox_is_taken() -> None:
    outbox = StreamOutbox(3, 100)
    calls: list[str] = []
    assert outbox.offer(b"one")
    outbox.when_drained(lambda: calls.append("first"))
    outbox.when_drained(lambda: calls.append("second"))  # replaces the first
    assert await asyncio.wait_for(outbox.take(), 5 * T) == [b"one"]
    assert calls == ["second"]
    assert outbox.offer(b"two")
    assert await asyncio.wait_for(outbox.take(), 5 * T) == [b"two"]
    assert calls == ["second"]  # one-shot: not called again


def test_when_drained_fires_when_a_mailbox_is_acknowledged_or_closed() -> None:
    mailbox = Mailbox(3, 100)
    calls: list[str] = []
    assert mailbox.offer(b"one")
    assert mailbox.offer(b"two")
    mailbox.when_drained(lambda: calls.append("ack"))
    mailbox.acknowledge(0)  # nothing numbered 0 or less: nothing left
    assert calls == []
    mailbox.acknowledge(1)
    assert calls == ["ack"]
    assert mailbox.room() == (2, 97)
    mailbox.when_drained(lambda: calls.append("close"))
    mailbox.when_drained(None)  # withdrawn
    mailbox.close()
    assert calls == ["ack"]
    mailbox.when_drained(lambda: calls.append("closed"))
    mailbox.close()
    assert calls == ["ack", "closed"]
