"""Where Redis spends its CPU per queued message on the broker's path (issue 17, point 2).

    python bench/queue_commandstats.py [--messages N] [--aof] [--target broker|engine|raw]

Runs ``bench/queues.py``'s broker path (a broker process on a private
``redis-server``, a WebSocket publisher with 100 ``asbp.publish`` outstanding
and a subscriber acknowledging per 50) once to warm up, then once measured:
around the measured run it resets Redis's statistics (``CONFIG RESETSTAT``) and
logs every call (``SLOWLOG`` with a threshold of 0), and prints, per message:

* each top-level call, scripts by name (their EVALSHA's SHA-1 mapped to the
  scripts of gateway/engines/redis/ and gateway/plane/redis/): calls and
  microseconds of Redis's time inside the call; then, indented, the commands
  the scripts made (part of their scripts' time);
* each command as ``INFO commandstats`` counts it (the commands scripts make
  counted under their own names too);
* redis-server's CPU per message from /proc, of which the calls above are a
  part (the rest is reading, parsing and answering the connections).

A profile, not a benchmark: the slow log costs Redis a little per call, so the
CPU it prints runs above ``bench/queues.py``'s.
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
        await client.config_set("slowlog-max-len", 1_000_000)
        await client.slowlog_reset()
        await client.config_resetstat()
        await client.config_set("slowlog-log-slower-than", 0)
        before = queues.schedstat(pid)
        rate = await run(args.messages)
        after = queues.schedstat(pid)
        await client.config_set("slowlog-log-slower-than", 10_000)
        entries: Any = await client.slowlog_get(-1)
        stats: Any = await client.info("commandstats")
    n = args.messages
    calls: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # calls, usec, inner
    for entry in entries:
        # redis-py joins the arguments with spaces: the first three are all we read.
        argv = _text(entry["command"]).split(" ", 3)[:3]
        command = argv[0].lower()
        if command in ("slowlog", "config", "info"):
            continue
        if command == "evalsha":
            key = "script " + names.get(argv[1], argv[1][:12])
        elif args.by_key and len(argv) > 1:
            # The key's kind: its name up to the first ':' after the prefix.
            key = command + " " + ":".join(argv[1].split(":")[:2])
        else:
            key = command
        # A command a script made is logged too, from the client "?:0": inside its
        # script's time, so listed apart (indented) and left out of the total.
        inner = _text(entry.get("client_address", "")) == "?:0"
        row = calls[("  " if inner else "") + key]
        row[0] += 1
        row[1] += int(entry["duration"])
        row[2] += inner
    total = sum(row[1] for row in calls.values() if not row[2])
    print(f"{n:,} messages, {rate:,.0f} msg/s, target {args.target}")
    print(f"{'call (indented: made by scripts)':34} {'calls/msg':>10} {'us/call':>9} {'us/msg':>8}")
    listed = sorted(calls.items(), key=lambda kv: (bool(kv[1][2]), -kv[1][1]))
    for key, (count, usec, _) in listed:
        print(f"{key:34} {count / n:10.3f} {usec / count:9.2f} {usec / n:8.2f}")
    print(f"{'(all top-level calls)':34} {'':10} {'':9} {total / n:8.2f}")
    print(f"\n{'command (INFO commandstats)':34} {'calls/msg':>10} {'us/call':>9} {'us/msg':>8}")
    rows: list[tuple[str, int, int]] = []
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        if name in ("slowlog", "config", "info"):
            continue
        rows.append((name, int(value["calls"]), int(value["usec"])))
    for name, count, usec in sorted(rows, key=lambda r: -r[2]):
        print(f"{name:34} {count / n:10.3f} {usec / count:9.2f} {usec / n:8.2f}")
    if before is not None and after is not None:
        print(f"\nredis-server CPU per message: {(after[0] - before[0]) / 1e3 / n:.2f} us")


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
