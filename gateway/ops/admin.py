"""``asbp status``, ``asbp channels``, ``asbp agents``, ``asbp queues`` (and ``asbp
queues peek|dead|requeue QUEUE``), ``asbp purge`` and ``asbp acl check``: the
management API (gateway.api) from a shell.

Each prints a table for people, or the API's JSON with ``--json`` for scripts.
``--url`` names the broker (default ``$ASBP_URL``, else
``http://127.0.0.1:8080``), ``--token-file`` the bearer token's file (default
``$ASBP_TOKEN_FILE``; none for a broker on loopback without authentication).

Exit status: 0 when the API answered (``acl check``: when access is allowed),
1 when it refused or could not be reached (one line on stderr says why),
3 when ``acl check`` was answered with a denial.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import httpx
import orjson

from gateway.errors import LocalError

__all__ = ["COMMANDS", "ApiRefused", "add_commands", "run"]

#: The commands this module adds to ``asbp``.
COMMANDS: Final = ("status", "channels", "agents", "queues", "purge", "acl")
DEFAULT_URL: Final = "http://127.0.0.1:8080"
EXIT_DENIED: Final = 3
#: Seconds a call may take.
_TIMEOUT: Final = 10.0


class ApiRefused(LocalError):
    """The management API could not be reached, or answered with an error."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help=f"the broker's base URL (default: $ASBP_URL or {DEFAULT_URL})"
    )
    parser.add_argument(
        "--token-file", type=Path, help="a file holding the bearer token ($ASBP_TOKEN_FILE)"
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def _paged(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, help="rows (default: %(default)s)")
    parser.add_argument("--offset", type=int, default=0, help="rows to skip")


def add_commands(commands: Any) -> None:
    """Add the management commands to ``asbp``'s subparsers."""
    _common(commands.add_parser("status", help="the broker: version, uptime, counts"))
    channels = commands.add_parser("channels", help="open Channels")
    _common(channels)
    _paged(channels)
    channels.add_argument("--after", help="start after this Channel-Identifier (a page's next)")
    _common(commands.add_parser("agents", help="Application-Agents, their Tubes and names"))
    queues = commands.add_parser(
        "queues",
        help="queues, the deepest first; or peek into one, list or move back its dead letters",
    )
    _common(queues)
    _paged(queues)
    # Optional: ``asbp queues`` alone lists them. A sub-command's options come
    # after it (``asbp queues peek jobs --url ...``).
    queue_commands = queues.add_subparsers(dest="queues_command", metavar="{peek,dead,requeue}")
    for name, text in (
        ("peek", "the next messages of QUEUE, leasing none"),
        ("dead", "QUEUE's dead letters, oldest first"),
    ):
        looking = queue_commands.add_parser(name, help=text)
        looking.add_argument("queue")
        looking.add_argument(
            "--limit", type=int, default=20, help="messages (default: %(default)s)"
        )
        _common(looking)
    requeue = queue_commands.add_parser(
        "requeue", help="move QUEUE's dead letters back into it, oldest first"
    )
    requeue.add_argument("queue")
    requeue.add_argument("--count", type=int, help="at most this many (default: all)")
    _common(requeue)
    purge = commands.add_parser("purge", help="remove the messages ready in a queue")
    purge.add_argument("queue")
    _common(purge)
    acl = commands.add_parser("acl", help="ask the access-control lists")
    acl_commands = acl.add_subparsers(dest="acl_command", required=True)
    check = acl_commands.add_parser(
        "check",
        help="may IDENTITY do ACTION on DESTINATION?",
        description="Exit status 0 if allowed, 3 if denied.",
    )
    check.add_argument("identity", help="an Application-Agent-Identifier")
    check.add_argument("action", type=str.upper, choices=("READ", "WRITE"))
    check.add_argument("destination", help="a topic, queue or Command-Name")
    check.add_argument(
        "--type",
        type=str.upper,
        default="COMMAND",
        choices=("COMMAND", "TOPIC", "QUEUE", "VIRTUAL_QUEUE"),
        help="what DESTINATION is (default: %(default)s)",
    )
    _common(check)
    policy = acl_commands.add_parser("policy", help="the policy IDENTITY is checked against")
    policy.add_argument("identity", help="an Application-Agent-Identifier")
    _common(policy)
    _common(
        acl_commands.add_parser(
            "reload", help="read the access-control lists again from their file"
        )
    )


def _request(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    method: str,
    path: str,
    **options: Any,
) -> Any:
    url = (args.url or environ.get("ASBP_URL") or DEFAULT_URL).rstrip("/")
    headers = {}
    token_file = args.token_file or environ.get("ASBP_TOKEN_FILE")
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ApiRefused(f"cannot read {token_file}: {exc.strerror or exc}") from exc
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx.request(
            method, f"{url}/api/v1{path}", headers=headers, timeout=_TIMEOUT, **options
        )
    except httpx.HTTPError as exc:
        raise ApiRefused(f"cannot reach {url}: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200:
        detail = body.get("detail") if isinstance(body, dict) else response.reason_phrase
        raise ApiRefused(f"{response.status_code}: {detail}")
    return body


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(headers), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in cells]  # fmt: skip
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return (
        f"{days}d {hours:02}:{minutes:02}:{secs:02}"
        if days
        else f"{hours:02}:{minutes:02}:{secs:02}"
    )


def _status(body: Any) -> str:
    rows = [
        (b["broker"], b["version"], b["engine"], b["server"], _duration(b["uptime_seconds"]),
         b["channels"], b["tubes"], b["subjects"], b["in_flight"])
        for b in body["brokers"]
    ]  # fmt: skip
    headers = ("broker", "version", "engine", "server", "uptime", "channels", "tubes",
               "subjects", "in flight")  # fmt: skip
    return _table(headers, rows) + f"\n(scope: {body['scope']})"


def _dash(value: object) -> object:
    """A cell another broker of the bus does not describe."""
    return "-" if value is None else value


def _channels(body: Any) -> str:
    rows = [
        (c["id"], c["broker"], _dash(c["transport"]), _dash(c["remote"]), _dash(c["in_flight"]),
         _dash(c["outbox_bytes"]), ",".join(c["groups"] or ()))
        for c in body["items"]
    ]  # fmt: skip
    table = _table(
        ("channel", "broker", "transport", "remote", "in flight", "outbox", "groups"), rows
    )
    more = f", next: --after {body['next_after']}" if body.get("next_after") else ""
    return table + f"\n{len(rows)} of {body['total']} (offset {body['offset']}{more})"


def _agents(body: Any) -> str:
    rows = [
        (a["agent"], a["broker"], t["id"], t["remote"], " ".join(t["serves"]), t["in_flight"])
        for a in body["items"]
        for t in a["tubes"]
    ]
    # Another broker's agents: their Tube count only (from its census card).
    rows += [
        (a["agent"], a["broker"], f"({a['tube_count']} Tubes)", "-", "-", "-")
        for a in body["items"]
        if not a["tubes"]
    ]
    return _table(("agent", "broker", "tube", "remote", "serves", "in flight"), rows)


def _queues(body: Any) -> str:
    rows = [
        (q["name"], q["depth"], q["consumers"], _age(q["oldest_age_seconds"]), q["dead_letters"])
        for q in body["items"]
    ]
    table = _table(("queue", "depth", "consumers", "oldest", "dead letters"), rows)
    return table + f"\n{len(rows)} of {body['total']} (offset {body['offset']})"


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else _duration(seconds)


def _messages(body: Any) -> str:
    rows = [
        (m["id"], m["priority"], m["deliveries"], m["payload_bytes"],
         m["payload"][:40].replace("\n", " "))
        for m in body["items"]
    ]  # fmt: skip
    table = _table(("message", "priority", "deliveries", "bytes", "payload"), rows)
    return table + f"\n{len(rows)} in {body['queue']}"


def _requeued(body: Any) -> str:
    return f"{body['queue']}: {body['moved']} dead letters moved back"


def _purged(body: Any) -> str:
    return f"{body['queue']}: {body['removed']} messages removed"


def _decision(body: Any) -> str:
    if not body["enabled"]:
        return "allowed (no access-control lists are configured)"
    verdict = "allowed" if body["allowed"] else "denied"
    entry = body["entry_index"]
    by = f"entry {entry}" if entry is not None else "its default action"
    return f"{verdict} by policy {body['policy']!r}, {by}"


def _policy(body: Any) -> str:
    if not body["enabled"]:
        return "no access-control lists are configured"
    return f"{body['identity']}: policy {body['policy']!r} (from {body['source']})"


def _reloaded(body: Any) -> str:
    return f"reloaded {body['source']}: policies {', '.join(body['policies'])}"


def run(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> int:
    """Run one management command; returns the exit status."""
    env = os.environ if environ is None else environ
    command: str = args.command
    calls: dict[str, tuple[str, str, dict[str, Any], Callable[[Any], str]]] = {
        "status": ("GET", "/broker", {}, _status),
        "agents": ("GET", "/agents", {}, _agents),
    }
    queues_command = getattr(args, "queues_command", None) if command == "queues" else None
    if queues_command is not None:
        path = f"/queues/{quote(args.queue, safe='/')}"
        if queues_command == "requeue":
            ask = {} if args.count is None else {"count": args.count}
            calls[command] = ("POST", f"{path}/dead-letters/requeue", {"json": ask}, _requeued)
        else:
            where = "messages" if queues_command == "peek" else "dead-letters"
            params = {"limit": args.limit}
            calls[command] = ("GET", f"{path}/{where}", {"params": params}, _messages)
    elif command in ("channels", "queues"):
        params = {"limit": args.limit, "offset": args.offset}
        if command == "channels" and args.after is not None:
            params["after"] = args.after
        render: Callable[[Any], str] = _channels if command == "channels" else _queues
        calls[command] = ("GET", f"/{command}", {"params": params}, render)
    elif command == "purge":
        calls[command] = ("POST", f"/queues/{quote(args.queue, safe='/')}/purge", {}, _purged)
    elif command == "acl" and args.acl_command == "policy":
        params = {"identity": args.identity}
        calls[command] = ("GET", "/acl/policy", {"params": params}, _policy)
    elif command == "acl" and args.acl_command == "reload":
        calls[command] = ("POST", "/acl/reload", {}, _reloaded)
    elif command == "acl":
        ask = {
            "identity": args.identity,
            "action": args.action,
            "destination": args.destination,
            "type": args.type,
        }
        calls[command] = ("POST", "/acl/check", {"json": ask}, _decision)
    method, path, options, render = calls[command]
    try:
        body = _request(args, env, method, path, **options)
    except ApiRefused as exc:
        print(f"asbp {command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(body))
    if command == "acl" and args.acl_command == "check" and not body["allowed"]:
        return EXIT_DENIED
    return 0
