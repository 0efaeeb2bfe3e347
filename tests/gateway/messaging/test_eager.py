"""gateway.messaging.eager: engine calls started on the spot, finished without a task.

Pure asyncio: the "engine calls" here are small coroutines that await futures the
test settles, so every step is deterministic (no sleeps, no timing).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.messaging.eager import start_eagerly

pytestmark = pytest.mark.anyio


async def returns(value: int, log: list[str]) -> int:
    log.append("ran")
    return value


async def raises() -> int:
    raise ValueError("refused")


async def awaits(*futures: asyncio.Future[int]) -> int:
    total = 0
    for future in futures:
        total += await future
    return total


async def next_turn() -> None:
    """Return once the callbacks already scheduled (with call_soon) have run."""
    loop = asyncio.get_running_loop()
    turn: asyncio.Future[None] = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


async def test_a_call_that_does_not_suspend_is_done_on_return() -> None:
    log: list[str] = []
    outcome = start_eagerly(returns(7, log))
    assert log == ["ran"]  # before start_eagerly returned
    assert outcome.done() and outcome.result() == 7
    assert not isinstance(outcome, asyncio.Task)


async def test_a_call_that_fails_at_once_is_done_with_its_error() -> None:
    outcome = start_eagerly(raises())
    assert outcome.done()
    with pytest.raises(ValueError, match="refused"):
        outcome.result()


async def test_first_steps_run_in_the_order_the_calls_start() -> None:
    loop = asyncio.get_running_loop()
    order: list[int] = []
    gate: asyncio.Future[int] = loop.create_future()

    async def call(n: int) -> int:
        order.append(n)
        return n + await gate

    outcomes = [start_eagerly(call(n)) for n in range(5)]
    assert order == [0, 1, 2, 3, 4]
    assert not any(outcome.done() for outcome in outcomes)
    gate.set_result(10)
    assert [await outcome for outcome in outcomes] == [10, 11, 12, 13, 14]


async def test_a_call_is_resumed_each_time_what_it_awaits_is_done() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()
    second: asyncio.Future[int] = loop.create_future()
    outcome = start_eagerly(awaits(first, second))
    assert not isinstance(outcome, asyncio.Task)
    first.set_result(1)
    await next_turn()
    assert not outcome.done()
    second.set_result(2)
    assert await outcome == 3


async def test_the_error_of_what_it_awaits_reaches_the_call() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()

    async def call() -> str:
        try:
            await reply
        except ConnectionError as exc:
            return f"handled {exc}"
        return "no error"

    outcome = start_eagerly(call())
    reply.set_exception(ConnectionError("lost"))
    assert await outcome == "handled lost"


async def test_an_error_after_a_suspension_fails_the_outcome() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()
    outcome = start_eagerly(awaits(reply))
    reply.set_exception(ConnectionError("lost"))
    with pytest.raises(ConnectionError, match="lost"):
        await outcome


async def test_a_bare_yield_is_stepped_again() -> None:
    async def call() -> int:
        await asyncio.sleep(0)
        return 5

    assert await start_eagerly(call()) == 5


async def test_cancelling_the_outcome_reaches_the_call_when_it_resumes() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def call() -> int:
        try:
            return await reply
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    outcome = start_eagerly(call())
    outcome.cancel()
    assert outcome.cancelled() and seen == []
    reply.set_result(1)  # the engine settles its call later (when it closes, say)
    await next_turn()
    assert seen == ["cancelled"]


async def test_a_call_that_yields_something_else_fails() -> None:
    class Odd:
        def __await__(self) -> Any:
            yield "not a future"

    async def call() -> None:
        await Odd()

    outcome = start_eagerly(call())
    assert outcome.done()
    with pytest.raises(RuntimeError, match="yielded 'not a future'"):
        outcome.result()


async def test_with_task_the_rest_runs_in_a_task_of_its_own() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()
    caller = asyncio.current_task()
    tasks: list[asyncio.Task[Any] | None] = []

    async def call() -> int:
        tasks.append(asyncio.current_task())
        value = await reply
        tasks.append(asyncio.current_task())
        async with asyncio.timeout(5):  # needs a task: the rest has one
            await next_turn()
        return value

    outcome = start_eagerly(call(), task=True)
    assert tasks == [caller]  # the first step ran now, in the caller's task
    assert isinstance(outcome, asyncio.Task)
    reply.set_result(4)
    assert await outcome == 4
    assert tasks == [caller, outcome]


async def test_with_task_a_call_that_does_not_suspend_needs_no_task() -> None:
    log: list[str] = []
    outcome = start_eagerly(returns(3, log), task=True)
    assert outcome.done() and outcome.result() == 3
    assert not isinstance(outcome, asyncio.Task)
    failed = start_eagerly(raises(), task=True)
    assert failed.done() and isinstance(failed.exception(), ValueError)


async def test_with_task_cancelling_the_task_cancels_the_call() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()
    outcome = start_eagerly(awaits(reply), task=True)
    await next_turn()  # the task's first step: it awaits reply
    outcome.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outcome
    assert reply.cancelled()
