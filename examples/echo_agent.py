"""An Application-Agent with two Respondents, ``echo`` and ``clock``, and optionally sign-ins.

``echo`` replies with the request's body (and its ``e``, if it had one).
``clock`` answers with a stream of three ticks of the clock, one a second,
each carrying ``o`` (its place) and the first also ``t`` (the total), as
§1.3.4.2 describes for "a large response"; the parts are produced lazily,
so the first is on its way before the last is made.

With ``--sign-in auth.login`` it also serves the broker's Authenticate-Command
(the broker's ``authenticate_command``, and ``serves`` in the agent's table
must name it): the body is a user name, signed in with the role ``user`` and
the address ``<name>*demo`` (a demo: no password), or refused when it is not
a plain lowercase name. Then ``whoami``, sent as that Subject, answers with
its name. ``asbp demo`` runs it so, for the demo page's two Subjects.

Run a broker that knows the agent's public key, then the agent::

    python -c "from agents import generate_agent_key as g; k, p = g(); \\
        open('echo.key', 'w').write(k); open('echo.pem', 'w').write(p)"
    asbp broker --insecure-dev-tubes ...      # with [agents.echo] public_key = "echo.pem"
    python examples/echo_agent.py --url ws://127.0.0.1:8080/tube --key-file echo.key

Every option can come from the environment instead: ``ASBP_TUBE_URLS``
(comma-separated; repeat ``--url`` for several brokers), ``ASBP_AGENT_ID``,
``ASBP_AGENT_KEY_FILE`` and ``ASBP_AUDIENCE``; ``--clock-interval`` sets the
seconds between ticks. Stop it with Ctrl-C: it
unregisters, finishes what it is doing, and leaves (at once, if it was still
connecting).

This file also ships inside the package, byte for byte, as
``agents/examples/echo_agent.py``: ``asbp demo`` runs that copy
(``python -m agents.examples.echo_agent``), so the demo works from an
installed package too. tests/agents/test_examples.py keeps the two identical.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

from agents import AgentCredentialSource, ApplicationAgent, Request
from asbp import HeaderInput

__all__ = ["MAX_SUBJECTS", "TICKS", "build_agent", "main", "parse_args"]

#: Parts in a clock stream.
TICKS = 3
#: Names of signed-in Subjects remembered for ``whoami``; the oldest go first,
#: so a long-running demo stays bounded.
MAX_SUBJECTS = 1000
_USER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def build_agent(
    identity: str,
    key_file: str,
    urls: Sequence[str],
    *,
    audience: str = "asbp-broker",
    clock_interval: float = 1.0,
    sign_in: str | None = None,
) -> ApplicationAgent:
    """The agent, with its Respondents registered (and ``sign_in``'s, when given)."""
    credentials = AgentCredentialSource.from_file(identity, key_file, audience=audience)
    agent = ApplicationAgent(identity, credentials, urls)

    @agent.respondent("echo")
    async def echo(request: Request) -> None:
        keys: dict[str, HeaderInput] = {}
        encoding = request.command.encoding
        if encoding is not None:
            keys["e"] = encoding
        await request.reply(request.body, **keys)

    @agent.respondent("clock")
    async def clock(request: Request) -> None:
        async def ticks() -> AsyncIterator[str]:
            for n in range(TICKS):
                if n:
                    await asyncio.sleep(clock_interval)
                yield datetime.now(UTC).isoformat(timespec="milliseconds")

        await request.stream(ticks(), total=TICKS)

    if sign_in is not None:
        names: OrderedDict[str, str] = OrderedDict()

        async def authenticate(request: Request) -> None:
            name = request.body.decode("utf-8", "replace").strip()
            if _USER_NAME.fullmatch(name) is None:
                await request.refuse(f"{name!r} is not a user name (a-z, digits, _ and -)")
                return
            subject = request.subject_id
            assert subject is not None  # the broker adds s to the Authenticate-Command
            names[subject] = name
            if len(names) > MAX_SUBJECTS:
                names.popitem(last=False)
            await request.authenticate("user", address=f"{name}*demo")

        agent.add_respondent(sign_in, authenticate)

        @agent.respondent("whoami")
        async def whoami(request: Request) -> None:
            subject = request.subject_id
            name = names.get(subject) if subject is not None else None
            await request.reply(name or "anonymous")

    return agent


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        action="append",
        dest="urls",
        help="a broker's Tube URL; repeat for several (env ASBP_TUBE_URLS, comma-separated)",
    )
    parser.add_argument("--identity", default=env.get("ASBP_AGENT_ID", "echo"))
    parser.add_argument("--key-file", default=env.get("ASBP_AGENT_KEY_FILE"))
    parser.add_argument("--audience", default=env.get("ASBP_AUDIENCE", "asbp-broker"))
    parser.add_argument("--clock-interval", type=float, default=1.0)
    parser.add_argument(
        "--sign-in", metavar="NAME", help="serve the broker's Authenticate-Command NAME too"
    )
    args = parser.parse_args(argv)
    if not args.urls:
        urls = env.get("ASBP_TUBE_URLS", "ws://127.0.0.1:8080/tube")
        args.urls = [url.strip() for url in urls.split(",") if url.strip()]
    if not args.key_file:
        parser.error("--key-file (or ASBP_AGENT_KEY_FILE) is required")
    return args


async def main(
    argv: Sequence[str] | None = None,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> int:
    """Serve until ``stop`` is set (or, without one, until SIGINT or SIGTERM).

    Args:
        argv: command-line arguments; ``sys.argv[1:]`` if None.
        stop: set it to shut down gracefully.
        ready: set once every broker has confirmed the registrations.
    """
    args = parse_args(argv)
    agent = build_agent(
        args.identity,
        args.key_file,
        args.urls,
        audience=args.audience,
        clock_interval=args.clock_interval,
        sign_in=args.sign_in,
    )
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    async with agent:
        # A stop while still connecting (no broker yet, or one that is stopping)
        # must not wait for a registration that may never come.
        registered = asyncio.create_task(agent.wait_registered())
        stopping = asyncio.create_task(stop.wait())
        _, pending = await asyncio.wait({registered, stopping}, return_when="FIRST_COMPLETED")
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if stop.is_set():
            return 0
        registered.result()  # raises what wait_registered() raised
        served = "echo and clock" if args.sign_in is None else f"echo, clock and {args.sign_in}"
        print(f"serving {served} at {', '.join(args.urls)}", file=sys.stderr)
        if ready is not None:
            ready.set()
        await stop.wait()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise SystemExit(asyncio.run(main()))
