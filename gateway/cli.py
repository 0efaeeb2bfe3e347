"""The ``asbp`` command: ``asbp broker`` runs a broker, ``asbp selfcheck`` the codec."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import asbp

__all__ = ["main"]

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asbp`` console script."""
    parser = argparse.ArgumentParser(prog="asbp", description="The ASBP gateway.")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("selfcheck", help="round-trip sample Commands through the codec")
    args = parser.parse_args(argv)
    if args.command in (None, "selfcheck"):
        return selfcheck()
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
