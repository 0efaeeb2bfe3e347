"""Where Redis spends its CPU per queued message on the broker's path (issue 17, point 2).

    python bench/queue_commandstats.py [--messages N] [--aof] [--target broker|engine|raw]

Runs ``bench/queues.py``'s broker path (a broker process on a private
``redis-server``, a WebSocket publisher with 100 ``asbp.publish`` outstanding
and a subscriber acknowledging per 50), or its ``engine`` or ``raw`` target,
once to warm up and twice measured, and prints per message:

* from the first run, with Redis's statistics reset before it (``CONFIG
  RESETSTAT``): each command as ``INFO commandstats`` counts it (EVALSHA for
  every script; the commands scripts make counted under their own names too),
  and redis-server's CPU from /proc, of which the commands are a part (the
  rest is reading, parsing and answering the connections);
* from the second, with every call logged (``SLOWLOG`` at a threshold of 0):
  each top-level call, scripts by name (their EVALSHA's SHA-1 mapped to the
  Script constants of gateway/engines/redis/ and gateway/plane/redis/), its
  calls, microseconds of Redis's time and share of all calls' time, and under
  it the commands it made (logged before their script, from the client
  ``?:0``; ``--by-key`` names each by its key's kind).

A profile, not a benchmark: the slow log costs Redis about a microsecond per
command logged, commands made by scripts included, so the second run's times run
above the first's, most for the scripts that make a command per message; and
``commandstats`` times are wall-clock time in the call, so a busy machine inflates
them. Compare shares within a run, and CPU per message with ``bench/queues.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import pkgutil
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import queues  # noqa: E402  # bench/queues.py, beside this file
from redis.asyncio import Redis  # noqa: E402  # after the sys.path lines above

from gateway.engines.redis.scripts import Script  # noqa: E402
from tests.support import RedisServer  # noqa: E402

#: Where the Lua scripts live: every module's Script constants are named by their SHA-1.
_SCRIPT_PACKAGES = ("gateway.engines.redis", "gateway.plane.redis")


def script_names() -> dict[str, str]:
    """SHA-1 → the script's name, for every Script constant of the Redis packages."""
    names: dict[str, str] = {}
    for package_name in _SCRIPT_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package_name}.{info.name}")
            for value in vars(module).values():
                if isinstance(value, Script):
                    names[value.sha] = value.name
    return names


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


async def profile(url: str, pid: int, args: argparse.Namespace, directory: Path) -> None:
    payload = b"x" * args.payload
    names = script_names()
    client = Redis.from_url(url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(client.aclose)
        if args.target == "broker":
            broker = await stack.enter_async_context(queues.broker_process(url, directory))

            async def run(messages: int) -> float:
                return await queues.run_broker(broker.url, messages, payload)
        elif args.target == "engine":

            async def run(messages: int) -> float:
                return await queues.run_engine(url, messages, payload)
        else:

            async def run(messages: int) -> float:
                return await queues.run_raw(url, messages, payload)

        await run(min(args.messages, 2000))  # warm up: connections, script cache
        # First without the slow log: Redis's real time in commands and its CPU.
        await client.config_resetstat()
        before = queues.schedstat(pid)
        rate = await run(args.messages)
        after = queues.schedstat(pid)
        plain: Any = await client.info("commandstats")
        # Then with every call logged, for who made which call.
        await client.config_set("slowlog-max-len", 1_000_000)
        await client.slowlog_reset()
        await client.config_resetstat()
        await client.config_set("slowlog-log-slower-than", 0)
        await run(args.messages)
        await client.config_set("slowlog-log-slower-than", 10_000)
        entries: Any = await client.slowlog_get(-1)
    n = args.messages
    print(f"{n:,} messages, {rate:,.0f} msg/s, target {args.target}")
    commandstats(n, plain)
    print("\nWith every call logged (SLOWLOG), by who made it:")
    report(n, attribute(entries, names, by_key=args.by_key))
    if before is not None and after is not None:
        print(f"\nredis-server CPU per message: {(after[0] - before[0]) / 1e3 / n:.2f} us")


@dataclass
class Calls:
    """One kind of call in the slow log: how many, their time, and the commands made
    inside them (a script's)."""

    count: int = 0
    usec: int = 0
    inner: int = 0
    made: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def attribute(entries: Any, names: dict[str, str], *, by_key: bool) -> dict[str, Calls]:
    """The slow log's entries by call: a script by its name, a command by its name (and
    its key's kind with ``by_key``). A command a script made is logged too, before the
    script's own entry and from the client ``?:0``: it is counted in its script's row."""
    calls: dict[str, Calls] = defaultdict(Calls)
    made: list[str] = []
    for entry in reversed(entries):  # oldest first: a script's commands, then it
        # redis-py joins the arguments with spaces: the first three are all we read.
        argv = _text(entry["command"]).split(" ", 3)[:3]
        command = argv[0].lower()
        if command in ("slowlog", "config", "info"):
            continue
        if _text(entry.get("client_address", "")) == "?:0":
            key = command
            if by_key and len(argv) > 1:  # the key's kind: its name's first two parts
                key += " " + ":".join(argv[1].split(":")[:2])
            made.append(key)
            continue
        name = "script " + names.get(argv[1], argv[1][:12]) if command == "evalsha" else command
        row = calls[name]
        row.count += 1
        row.usec += int(entry["duration"])
        row.inner += len(made)
        for key in made:
            row.made[key] += 1
        made = []
    return calls


def report(n: int, calls: dict[str, Calls]) -> None:
    """Per message: each call's time in Redis and its share, with the commands a script made."""
    total = sum(row.usec for row in calls.values())
    print(
        f"{'call':30} {'calls/msg':>9} {'us/call':>8} {'us/msg':>7} {'share':>6} {'cmds/call':>9}"
    )
    for name, row in sorted(calls.items(), key=lambda kv: -kv[1].usec):
        if row.usec < total / 1000:
            continue  # start-up and housekeeping: nothing per message
        print(
            f"{name:30} {row.count / n:9.3f} {row.usec / row.count:9.2f} {row.usec / n:9.2f}"
            f" {row.usec / total:9.1%} {row.inner / row.count:9.1f}"
        )
        for key, count in sorted(row.made.items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {key:26} {count / n:9.3f} per message")
    print(f"{'(all calls)':30} {'':9} {'':9} {total / n:9.2f}")


def commandstats(n: int, plain: Any) -> None:
    """INFO commandstats of the run without the slow log, per message."""
    print(f"\n{'command (INFO commandstats, no slow log)':42} {'calls/msg':>9} {'us/msg':>7}")
    rows = [
        (key.removeprefix("cmdstat_"), int(value["calls"]), int(value["usec"]))
        for key, value in plain.items()
    ]
    for name, count, usec in sorted(rows, key=lambda r: -r[2]):
        if usec >= n / 100 and name not in ("slowlog", "config|set", "config|resetstat", "info"):
            print(f"{name:42} {count / n:9.3f} {usec / n:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--aof", action="store_true", help="appendonly, appendfsync always")
    parser.add_argument("--target", choices=("broker", "engine", "raw"), default="broker")
    parser.add_argument(
        "--by-key", action="store_true", help="commands by their key's kind (asbp:q, log…)"
    )
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as directory,
        RedisServer(Path(directory) / "redis", appendonly=args.aof) as server,
    ):
        asyncio.run(profile(server.url, server.pid, args, Path(directory)))


if __name__ == "__main__":
    main()
