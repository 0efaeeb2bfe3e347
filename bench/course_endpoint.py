"""The answering side of a Course: crossings taken on the read path against the task.

    python bench/course_endpoint.py [--crossings N] [--bursts 1,4,32] [--rounds N]

One broker of bus ``b.test`` (Hypercorn, memory engine) runs in this process with
bob signed in; a Course from ``a.test`` is played by hand (a WebSocket client with
a.test's credential) and sends crossings for bob, one per WebSocket message, in
bursts of ``--bursts`` messages, bob reading each burst before the next. Each
round opens one Course with the endpoint taking its messages on the server's read
path (RECEIVE_FRAMES, courses/endpoint.py: what a memory-engine broker alone on
its bus does) and one with the endpoint's task taking them as ``websocket.receive``
events (what it did before, and still does on ``redis``), alternately, so both
run under the same load. Printed: this process's CPU per crossing (the broker,
the Course's client and bob: only the broker's part differs), medians of the
rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
# Run as ``python bench/course_endpoint.py``, Python puts bench/ first on the path,
# not the checkout: the checkout's packages and tests.support are found from here.
sys.path.insert(0, str(ROOT))
from asbp import Command, encode  # noqa: E402
from courses.credential import SigningKey  # noqa: E402
from courses.service import Courses  # noqa: E402
from gateway.app import create_app  # noqa: E402
from tests.courses.buses import bus_config, make_bus, signin_agent, user  # noqa: E402
from tests.support import serve_app_async  # noqa: E402


def _crossing(n: int) -> bytes:
    return encode(
        Command(
            {
                "c": "chat",
                "r": "bob*b.test",
                "p": "alice*a.test",
                "course.id": f"{n:032x}",
                "course.via": ["a.test"],
            },
            b"hello",
        )
    )


async def run(args: argparse.Namespace) -> None:
    bursts = [int(b) for b in args.bursts.split(",")]
    with tempfile.TemporaryDirectory(prefix="asbp-endpoint-") as tmp:
        a, b = make_bus(Path(tmp), "a.test"), make_bus(Path(tmp), "b.test")
        app = create_app(bus_config(b, {a: []}, tls=None))
        async with contextlib.AsyncExitStack() as stack:
            running = await stack.enter_async_context(serve_app_async(app, tls=None))
            agent = signin_agent(b, running.ws_url + "/tube", None)
            await stack.enter_async_context(agent)
            await agent.wait_registered(10)
            bob = await stack.enter_async_context(user(running.ws_url, "bob", None))
            courses: Courses = app.state.courses
            key = SigningKey((a.directory / "bus.pem").read_bytes(), domain="a.test")
            sent = 0
            for burst in bursts:
                cpu: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.rounds):
                    for read_path in (True, False):
                        courses.accepts_at_once = read_path
                        frames = [_crossing(sent + n) for n in range(args.crossings)]
                        sent += args.crossings
                        token, _ = key.sign("b.test", lifetime=60)
                        async with connect(
                            f"{running.ws_url}/course",
                            additional_headers={"Authorization": f"Bearer {token}"},
                        ) as course:
                            await course.recv()  # asbp.course
                            began = time.process_time()
                            for start in range(0, len(frames), burst):
                                for frame in frames[start : start + burst]:
                                    await course.send(frame)
                                for _ in frames[start : start + burst]:
                                    await bob.ws.recv()
                            used = time.process_time() - began
                        cpu[read_path].append(used / args.crossings * 1e6)
                on, off = statistics.median(cpu[True]), statistics.median(cpu[False])
                print(
                    f"bursts of {burst:>3}: read path {on:6.1f} us/crossing, "
                    f"task {off:6.1f} us/crossing, ratio {on / off:.2f} "
                    f"(rounds: {', '.join(f'{x:.1f}' for x in cpu[True])} | "
                    f"{', '.join(f'{x:.1f}' for x in cpu[False])})"
                )
            courses.accepts_at_once = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crossings", type=int, default=4000, help="per Course, per round")
    parser.add_argument("--bursts", default="1,4,32", help="messages sent before bob reads")
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
