"""A User-Agent that calls the ``echo`` and ``clock`` Respondents of echo_agent.py.

With a broker and examples/echo_agent.py running::

    python examples/user_agent.py --url ws://127.0.0.1:8080/asbp --text "hello"

``--url`` defaults to ``ASBP_URL``, then ``ws://127.0.0.1:8080/asbp``. An
``http://`` URL uses the stateless HTTP Channel (POST and long-poll) instead
of a WebSocket; the calls are the same.

``--call NAME`` (repeatable) calls ``NAME`` too and prints its answer or its
fault with the ``u`` it came back with, which is how docs/tiers.md shows a
fault crossing every tier of a chain to the sender's own ``u``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from agents import FaultError, UserAgent


async def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Call ``echo`` and ``clock`` once each and print what comes back.

    Returns:
        0 on success, 1 if the broker or agent answered with a fault.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ASBP_URL", "ws://127.0.0.1:8080/asbp"))
    parser.add_argument("--text", default="hello, ASBP")
    parser.add_argument("--call", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    if args.url.startswith(("http://", "https://")):
        ua = UserAgent.http(args.url)
    else:
        ua = UserAgent.websocket(args.url)
    async with ua:
        print(f"channel {ua.channel_id} at broker {ua.broker_id}", file=out)
        try:
            reply = await ua.request("echo", args.text)
            print(f"echo: {reply.body.decode()}", file=out)
            total = None
            async for part in ua.stream("clock"):
                total = part.total or total
                print(f"clock {part.of_total}/{total}: {part.body.decode()}", file=out)
        except FaultError as exc:
            print(f"fault {exc}", file=out)
            return 1
        status = 0
        for name in args.call:
            try:
                answer = await ua.request(name, args.text)
            except FaultError as exc:
                print(f"{name} u={exc.command_id}: fault {exc}", file=out)
                status = 1
            else:
                print(f"{name} u={answer.command_id}: {answer.body.decode()}", file=out)
    return status


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
