"""The ``asbp`` command.

::

    asbp broker [--config FILE] [--host H] [--port P] ...   run a broker
    asbp config [--format toml|json] [same flags]            print the effective config
    asbp selfcheck                                           round-trip the codec
    asbp analytics --events DIR --output DIR [...]           the Spark analytics job
    asbp demo [--port P] [--data-dir DIR]                    a broker and the example agent
    asbp [--port P] [--data-dir DIR]                         the same: asbp demo
    asbp status|channels|agents|queues [--url U] [--json]    the management API
    asbp purge QUEUE | asbp acl check IDENTITY ACTION DEST   (gateway.ops.admin)

``python -m gateway`` is ``asbp broker``. Exit status: 0 after a clean stop (SIGINT or
SIGTERM), 2 for a configuration error, 1 when the broker cannot listen or fails to
start (one log line says why, for ``asbp broker`` and ``asbp demo`` alike), 130 when
interrupted before it could install its signal handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import orjson

import asbp
from gateway.config import (
    ConfigError,
    GatewayConfig,
    add_arguments,
    config_to_dict,
    config_to_toml,
    load_config,
)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "broker",
    "main",
    "selfcheck",
    "show_config",
]

#: Exit status for a configuration error, as argparse uses for a usage error.
EXIT_CONFIG: int = 2
#: Exit status when the broker cannot listen or its application fails to start.
EXIT_FAILURE: int = 1

# A Command for each shape the codec distinguishes: bare, quoted, lists, UTF-8.
_SAMPLES: tuple[asbp.Command, ...] = (
    asbp.Command(c="asbp.ping", u=1),
    asbp.Command(
        {"c": "display text", "g": ("friends", "country men")},
        b"Hello World!",
        d="de305d5475b4431badb2eb6b9e546014",
    ),
    asbp.Command({"c": "grüße", "r": ("bob*example.org",)}, b"\x00\xff"),
)


def selfcheck() -> int:
    """Round-trip sample Commands through the codec and report the speed."""
    for command in _SAMPLES:
        frame = asbp.encode(command)
        if asbp.decode(frame) != command:
            print(f"FAIL: {command!r} did not survive a round trip", file=sys.stderr)
            return 1
        print(f"ok  {frame!r}")
    frame = asbp.encode(_SAMPLES[1])
    rounds = 20_000
    start = time.perf_counter()
    for _ in range(rounds):
        asbp.decode(frame)
    elapsed = time.perf_counter() - start
    print(f"decode: {elapsed / rounds * 1e9:.0f} ns per Command ({len(frame)} bytes)")
    return 0


def broker(config: GatewayConfig, *, prog: str = "asbp broker") -> int:
    """Run a broker with ``config`` until SIGINT or SIGTERM; return the exit status.

    Configures logging from ``config`` first. A configuration error found only now (an
    unusable ``data_dir``) is printed like the others; a failure to start is logged,
    so that it reaches the same place as the rest of the broker's log.
    """
    from gateway.ops.logs import configure_logging
    from gateway.ops.loops import run as run_on_loop

    # Imported here: the servers and the app are what `asbp config` and `asbp
    # selfcheck` should not wait for.
    from gateway.ops.server import serve

    configure_logging(config.log_format, config.log_level)

    def run() -> int:
        # On the loop the ``loop`` setting picks (uvloop by default where installed:
        # gateway/ops/loops.py says why); the servers run inside it.
        run_on_loop(lambda: serve(config), config.loop)
        return 0

    return _serving(run, prog)


def _serving(run: Callable[[], int], prog: str) -> int:
    """``run()``, with a failure to start reported in one line rather than a traceback."""
    from gateway.ops.server import ServerError

    try:
        return run()
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ServerError as exc:
        logging.getLogger("gateway.ops.cli").critical("cannot start", extra={"error": str(exc)})
        return EXIT_FAILURE


def show_config(config: GatewayConfig, format: str) -> int:
    """Print the effective ``config`` as TOML or JSON, secrets masked."""
    if format == "json":
        text = orjson.dumps(config_to_dict(config), option=orjson.OPT_INDENT_2).decode() + "\n"
    else:
        text = config_to_toml(config)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `asbp config | head`: the reader has seen enough
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    prog: str = "asbp",
) -> int:
    """Entry point of the ``asbp`` console script; returns the exit status.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` by default.
        environ: where ``ASBP_*`` settings are read; ``os.environ`` by default.
        prog: the program name in usage and error messages.
    """
    parser = argparse.ArgumentParser(prog=prog, description="The ASBP gateway.")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("selfcheck", help="round-trip sample Commands through the codec")
    broker_parser = commands.add_parser(
        "broker",
        help="run a broker",
        description="Run a broker until SIGINT or SIGTERM. Flags override ASBP_* "
        "variables, which override the TOML file; see docs/configuration.md.",
    )
    add_arguments(broker_parser)
    config_parser = commands.add_parser(
        "config",
        help="print the effective configuration (secrets masked)",
        description="Print the configuration `asbp broker` would run with, given the "
        "same flags, file and environment. Secrets are masked.",
    )
    config_parser.add_argument("--format", choices=("toml", "json"), default="toml")
    add_arguments(config_parser)
    demo_parser = commands.add_parser(
        "demo",
        help="run a broker and the example agent on loopback (the default)",
        description="Run a broker on 127.0.0.1 with the example Application-Agent "
        "(examples/echo_agent.py, shipped as agents.examples.echo_agent) connected, and "
        "print how to talk to it. A bare `asbp` is `asbp demo`. Ctrl-C or SIGTERM stops both.",
    )
    demo_parser.add_argument(
        "--port", type=int, default=8080, help="0: any free port (default: %(default)s)"
    )
    demo_parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".asbp-demo"),
        help="the broker identity and the agent's key pair (default: %(default)s)",
    )
    # Listed here for `asbp --help`; its options (and its own --help) are the SDK's
    # (agents.spark.analytics_cli), which this parser hands everything after the word.
    commands.add_parser(
        "analytics",
        add_help=False,
        help="the Spark analytics job over the event log (needs the spark extra)",
    )
    # Imported here: the management commands' client is only for these commands.
    from gateway.ops import admin

    admin.add_commands(commands)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        # A bare `asbp` (the README's first command ends in it) is `asbp demo`, and takes
        # the demo's options: `asbp --port 9000`.
        argv.insert(0, "demo")
    args, rest = parser.parse_known_args(argv)

    if args.command == "analytics":
        # Imported here, and only here: the job is the SDK's, which never imports the
        # broker, and pyspark (the spark extra) is what the broker never needs.
        from agents.spark.analytics_cli import main as analytics

        return analytics(rest, prog=f"{parser.prog} analytics")
    if rest:  # what parse_args would have refused
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "selfcheck":
        return selfcheck()
    if args.command in admin.COMMANDS:
        return admin.run(args, environ=environ)
    if args.command == "demo":
        try:
            from gateway.ops.demo import demo

            return _serving(lambda: demo(args.port, args.data_dir), f"{parser.prog} demo")
        except KeyboardInterrupt:  # before the demo installed its signal handlers
            return 130
    try:
        config = load_config(args, environ=os.environ if environ is None else environ)
    except ConfigError as exc:
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "config":
        return show_config(config, args.format)
    try:
        return broker(config, prog=f"{parser.prog} broker")
    except KeyboardInterrupt:  # before the signal handlers were installed
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
