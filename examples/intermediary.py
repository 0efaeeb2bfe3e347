"""An Intermediary-Agent (draft §3.4): an Application-Agent of one bus, a User-Agent of the next.

The four-tier chain: a User-Agent → broker A → this agent → broker B (or a
Broker-Agent) → the Respondent::

    python examples/intermediary.py --upstream ws://127.0.0.1:8080/tube \\
        --identity gate --key-file gate.key \\
        --downstream ws://127.0.0.1:8081/asbp --name echo --name clock

Broker A must know ``gate``'s public key (``[agents.gate]``, as for any
agent). Every ``echo`` or ``clock`` a User-Agent of broker A sends goes on to
broker B, and the answer comes back with the sender's ``u``; a fault anywhere
on the way (no Respondent at B, a timeout, B's agent leaving) comes back as
that fault, never as silence.

Options also come from the environment: ``ASBP_TUBE_URLS`` (comma-separated),
``ASBP_AGENT_ID``, ``ASBP_AGENT_KEY_FILE``, ``ASBP_AUDIENCE``,
``ASBP_DOWNSTREAM_URL`` and ``ASBP_FORWARD`` (comma-separated names). It prints
``forwarding <names> from <upstream> to <downstream>`` on standard error once
it serves, and stops cleanly on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from agents import AgentCredentialSource, ApplicationAgent, Downstream, IntermediaryAgent

__all__ = ["main"]


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


async def main(
    argv: Sequence[str] | None = None,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> int:
    """Forward until ``stop`` is set (or, without one, until SIGINT or SIGTERM).

    Args:
        argv: command-line arguments; ``sys.argv[1:]`` if None.
        stop: set it to shut down gracefully.
        ready: set once the downstream Channel is open and the names registered.
    """
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", action="append", dest="urls", help="broker A's Tube URL")
    parser.add_argument("--identity", default=env.get("ASBP_AGENT_ID", "gate"))
    parser.add_argument("--key-file", default=env.get("ASBP_AGENT_KEY_FILE"))
    parser.add_argument("--audience", default=env.get("ASBP_AUDIENCE", "asbp-broker"))
    parser.add_argument("--downstream", default=env.get("ASBP_DOWNSTREAM_URL"))
    parser.add_argument("--name", action="append", dest="names", help="a Command-Name to pass on")
    parser.add_argument("--timeout", type=float, default=50.0, help="seconds to wait downstream")
    parser.add_argument("--channels", type=int, default=1, help="Channels to open downstream")
    args = parser.parse_args(argv)
    urls = args.urls or _split(env.get("ASBP_TUBE_URLS", "ws://127.0.0.1:8080/tube"))
    names = args.names or _split(env.get("ASBP_FORWARD", "echo,clock"))
    if not args.key_file:
        parser.error("--key-file (or ASBP_AGENT_KEY_FILE) is required")
    if not args.downstream:
        parser.error("--downstream (or ASBP_DOWNSTREAM_URL) is required")

    credentials = AgentCredentialSource.from_file(
        args.identity, args.key_file, audience=args.audience
    )
    upstream = ApplicationAgent(args.identity, credentials, urls)
    downstream = Downstream(args.downstream, timeout=args.timeout, channels=args.channels)
    intermediary = IntermediaryAgent(upstream=upstream, downstream=downstream, names=names)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    await downstream.start()
    try:
        # A stop while still connecting must not wait for a bus that may never come.
        starting = asyncio.create_task(_serve(intermediary, upstream))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when="FIRST_COMPLETED")
        if not starting.done():
            starting.cancel()
            await asyncio.wait({starting})
            return 0
        stopping.cancel()
        starting.result()
        print(
            f"forwarding {', '.join(names)} from {', '.join(urls)} to {args.downstream}",
            file=sys.stderr,
            flush=True,
        )
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        await intermediary.close()
    return 0


async def _serve(intermediary: IntermediaryAgent, upstream: ApplicationAgent) -> None:
    await intermediary.start()
    await upstream.wait_registered()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sys.exit(asyncio.run(main()))
