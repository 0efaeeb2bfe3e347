"""Flow control toward publishers: an unpaced publisher against 20 subscribers.

    python bench/flow.py [--messages 400] [--subscribers 20] [--repeats 3]

Issue 16's figure. One publisher sends 64 KiB topic messages to a topic with 20
subscribers that read as fast as they can, on the real broker (memory engine,
default limits: 1,024 Commands or 4 MiB per Channel outbox) in its own process
(bench/_fanout_servers.py), on Hypercorn and on Uvicorn:

* **paced**: the baseline. The publisher sends the next message only once
  every subscriber has the previous one (nothing ever queues in the broker).
* **unpaced**: the publisher sends every message back to back; the broker's
  flow control (gateway/connections/flow.py) reads it only as fast as the
  subscribers drain. Before it, every subscriber was cut off (1008, 2105) after
  107-327 messages.

For each run: messages per second (delivered to all subscribers), MiB/s
delivered in total, subscribers cut off, and messages missing at any
subscriber; then the unpaced rate's ratio to the paced one, within a repeat.
The targets run interleaved; the table shows medians. Clients are
``websockets`` connections with compression off, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "_fanout_servers.py"
BODY = 64 * 1024
TOPIC = b"/bench/flow"
START_TIMEOUT = 30.0
RUN_TIMEOUT = 300.0


@dataclass
class Result:
    rate: float  # messages per second, delivered to every subscriber
    mib_per_s: float
    cut_off: int
    missing: int


class Broker:
    """A bench/_fanout_servers.py broker process; stopped by closing its stdin."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def __aenter__(self) -> Broker:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVERS), "broker", "--server", self.server,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            raise RuntimeError(f"{self.server}: the broker did not start ({line!r})")
        self.port = int(line.split()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), START_TIMEOUT)


async def channel(port: int) -> ClientConnection:
    ws = await connect(
        f"ws://127.0.0.1:{port}/asbp", compression=None, max_size=None, ping_interval=None
    )
    greeting = await ws.recv()
    assert isinstance(greeting, bytes) and greeting.startswith(b"c=asbp.channel,"), greeting
    return ws


async def subscribe(ws: ClientConnection) -> None:
    await ws.send(b"c=asbp.subscribe,destination=" + TOPIC + b",u=1;")
    reply = await ws.recv()
    assert isinstance(reply, bytes) and reply.startswith(b"c=asbp.accepted"), reply


def frame(n: int) -> bytes:
    return b"c=asbp.publish,destination=" + TOPIC + b";" + b"%08d" % n + bytes(BODY - 8)


async def run(port: int, subscribers: int, messages: int, *, paced: bool) -> Result:
    readers = [await channel(port) for _ in range(subscribers)]
    for ws in readers:
        await subscribe(ws)
    publisher = await channel(port)
    counts = [0] * messages
    everyone: list[asyncio.Event] = [asyncio.Event() for _ in range(messages)]
    cut = 0

    async def read(ws: ClientConnection) -> None:
        nonlocal cut
        seen = 0
        try:
            while seen < messages:
                data = await ws.recv()
                assert isinstance(data, bytes)
                body = data[data.index(b";") + 1 :]
                n = int(body[:8])
                seen += 1
                counts[n] += 1
                if counts[n] == subscribers:
                    everyone[n].set()
        except ConnectionClosed:
            cut += 1
            for event in everyone:
                event.set()  # nothing more comes: let the run end

    tasks = [asyncio.create_task(read(ws)) for ws in readers]
    began = time.perf_counter()
    for n in range(messages):
        await publisher.send(frame(n))
        if paced:
            await everyone[n].wait()
    await asyncio.wait_for(asyncio.gather(*tasks), RUN_TIMEOUT)
    took = time.perf_counter() - began
    for ws in [*readers, publisher]:
        await ws.close()
    missing = sum(subscribers - count for count in counts)
    delivered = sum(counts)
    return Result(messages / took, delivered * BODY / took / 2**20, cut, missing)


async def main(args: argparse.Namespace) -> None:
    rows: dict[tuple[str, str], list[Result]] = {}
    ratios: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for server in ("hypercorn", "uvicorn")[:: 1 if repeat % 2 == 0 else -1]:
            async with Broker(server) as broker:
                paced = await run(broker.port, args.subscribers, args.messages, paced=True)
                unpaced = await run(broker.port, args.subscribers, args.messages, paced=False)
            rows.setdefault((server, "paced"), []).append(paced)
            rows.setdefault((server, "unpaced"), []).append(unpaced)
            ratios.setdefault(server, []).append(unpaced.rate / paced.rate)
            print(
                f"repeat {repeat + 1} {server}: paced {paced.rate:.0f}/s, unpaced "
                f"{unpaced.rate:.0f}/s, cut off {unpaced.cut_off}, missing {unpaced.missing}",
                file=sys.stderr,
            )
    print(f"{args.subscribers} subscribers, {args.messages} messages of {BODY // 1024} KiB")
    print(f"{'target':<22}{'msg/s':>9}{'MiB/s':>9}{'cut off':>9}{'missing':>9}")
    for (server, mode), results in rows.items():
        print(
            f"{server + ' ' + mode:<22}"
            f"{statistics.median(r.rate for r in results):>9.0f}"
            f"{statistics.median(r.mib_per_s for r in results):>9.0f}"
            f"{max(r.cut_off for r in results):>9}"
            f"{max(r.missing for r in results):>9}"
        )
    for server, values in ratios.items():
        print(
            f"{server}: unpaced/paced rate {statistics.median(values):.2f}x "
            f"(range {min(values):.2f}-{max(values):.2f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
