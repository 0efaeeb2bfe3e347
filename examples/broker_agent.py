"""A three-tier Broker-Agent (draft §2.5, §3.2): User-Agents connect to it directly.

It serves ``echo`` and ``clock`` exactly as examples/echo_agent.py does (the
same handler code, in process instead of behind a broker), and a small
storage tier, ``notes.put`` (the body is ``key=value``) and ``notes.get``
(the body is a key; a missing key is answered with fault 2101, an
application's choice), kept in a bounded in-memory map::

    python examples/broker_agent.py --port 8090
    python examples/user_agent.py --url ws://127.0.0.1:8090/asbp --text "hello"

With ``--downstream URL --forward NAME`` it is also an Intermediary: ``NAME``
is passed on to the bus at ``URL`` (a broker's or another Broker-Agent's
``/asbp``), instead of served here if it is one of the names above, and its
answer, or its fault, comes back with the sender's ``u``.

It prints ``listening <url>`` on standard output once it accepts Channels
(``--port 0`` picks a free port), and stops cleanly on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

from agents import BrokerAgent, Downstream, Request, forward_to
from asbp import FaultCode

__all__ = ["MAX_NOTES", "build", "main"]

#: Notes kept; the oldest go first, so the example stays bounded.
MAX_NOTES = 10_000
#: Parts in a clock stream (as echo_agent.py).
TICKS = 3


def build(
    broker_id: str, *, clock_interval: float = 1.0, allowed_origins: Sequence[str] = ()
) -> BrokerAgent:
    """The Broker-Agent with its Respondents."""
    broker = BrokerAgent(broker_id, allowed_origins=allowed_origins)
    notes: OrderedDict[str, bytes] = OrderedDict()

    @broker.respondent("echo")
    async def echo(request: Request) -> None:
        encoding = request.command.encoding
        await request.reply(request.body, **({"e": encoding} if encoding else {}))

    @broker.respondent("clock")
    async def clock(request: Request) -> None:
        async def ticks() -> AsyncIterator[str]:
            for n in range(TICKS):
                if n:
                    await asyncio.sleep(clock_interval)
                yield datetime.now(UTC).isoformat(timespec="milliseconds")

        await request.stream(ticks(), total=TICKS)

    @broker.respondent("notes.put")
    async def put(request: Request) -> str | None:
        raw_key, separator, value = request.body.partition(b"=")
        if not separator or not raw_key:
            await request.fault(FaultCode.INVALID_MESSAGE_FORMAT, "the body is key=value")
            return None
        key = raw_key.decode("utf-8", "replace")
        notes[key] = value
        notes.move_to_end(key)
        if len(notes) > MAX_NOTES:
            notes.popitem(last=False)
        return "stored"

    @broker.respondent("notes.get")
    async def get(request: Request) -> bytes | None:
        value = notes.get(request.body.decode("utf-8", "replace"))
        if value is None:
            await request.fault(FaultCode.NO_RESPONDENT, "no such note")
            return None
        return value

    return broker


async def main(argv: Sequence[str] | None = None, *, stop: asyncio.Event | None = None) -> int:
    """Serve until ``stop`` is set (or, without one, until SIGINT or SIGTERM)."""
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(env.get("ASBP_PORT", "8090")))
    parser.add_argument("--broker-id", default=env.get("ASBP_BROKER_ID", "broker-agent"))
    parser.add_argument("--clock-interval", type=float, default=1.0)
    parser.add_argument("--origin", action="append", default=[], help="a web origin to allow")
    parser.add_argument("--downstream", help="the next bus's Channel URL (ws://host/asbp)")
    parser.add_argument("--forward", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    if args.forward and not args.downstream:
        parser.error("--forward needs --downstream")
    broker = build(args.broker_id, clock_interval=args.clock_interval, allowed_origins=args.origin)
    downstream = Downstream(args.downstream) if args.downstream else None
    if downstream is not None:
        handler = forward_to(downstream)
        for name in args.forward:
            if name in broker.respondent_names:
                await broker.remove_respondent(name)  # passed on instead of served here
            broker.add_respondent(name, handler)
        await downstream.start()
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    try:
        async with broker.serving(args.host, args.port):
            print(f"listening {broker.url(args.host)}", flush=True)
            await stop.wait()
    finally:
        if downstream is not None:
            await downstream.stop()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sys.exit(asyncio.run(main()))
