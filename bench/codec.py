"""The ASBP codec against urllib.parse on the same pairs, in one process.

    python bench/codec.py [--runs N] [--quick]

A typical six-key header with a 100-byte body, and the query string holding
the same seven pairs (the list of two groups is two ``g`` pairs):

===========================  =============================================
asbp.decode (C)              the frame below, into a Command, with the C
                             accelerator (asbp._speedups) trying first
asbp.decode (pure)           the same with ``codec.speedups_enabled`` off:
                             the pure-Python fast path
urllib.parse.parse_qsl(QS)   the baseline for decode
asbp.encode(COMMAND)         that Command back into the same frame
urllib.parse.urlencode(...)  the baseline for encode
===========================  =============================================

``decode`` takes the C path by default wherever the extension was built;
where it was not, the "(C)" row is left out and "(pure)" is the default.
Each run times every case with ``timeit`` (the best of three batches, in a
rotated order) and divides within the run, so that load on the machine
shifts both sides of a ratio alike. The table and the speed-ups are medians
over the runs. The goal: decode (by its default path) and encode at least
twice as fast as their baselines.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import timeit
import urllib.parse

import asbp
from asbp import codec

ID_D, ID_S, ID_I = (
    "de305d5475b4431badb2eb6b9e546014",
    "0123456789abcdef0123456789abcdef",
    "fedcba9876543210fedcba9876543210",
)
BODY = bytes(range(100))
FRAME = f"c=chat.send,g=[friends,'country men'],d={ID_D},u=42,s={ID_S},i={ID_I};".encode() + BODY
PAIRS = [
    ("c", "chat.send"),
    ("g", "friends"),
    ("g", "country men"),
    ("d", ID_D),
    ("u", "42"),
    ("s", ID_S),
    ("i", ID_I),
]
QUERY = urllib.parse.urlencode(PAIRS)
COMMAND = asbp.decode(FRAME)

#: Whether the C accelerator was built (and so is decode's default path).
HAVE_SPEEDUPS = codec._decode_c is not None
#: The decode case the goal applies to: the path decode takes by default.
DEFAULT_DECODE = "asbp.decode (C)" if HAVE_SPEEDUPS else "asbp.decode (pure)"

#: name -> (statement, setup, the name of its baseline or None). The setups
#: pick decode's path; they run before each timed batch, outside the timing.
CASES = {
    **(
        {"asbp.decode (C)": ("decode(FRAME)", "use_speedups(True)", "urllib.parse.parse_qsl")}
        if HAVE_SPEEDUPS
        else {}
    ),
    "asbp.decode (pure)": ("decode(FRAME)", "use_speedups(False)", "urllib.parse.parse_qsl"),
    "urllib.parse.parse_qsl": ("parse_qsl(QUERY)", "pass", None),
    "asbp.encode": ("encode(COMMAND)", "pass", "urllib.parse.urlencode"),
    "urllib.parse.urlencode": ("urlencode(PAIRS)", "pass", None),
}


def use_speedups(enabled: bool) -> None:
    codec.speedups_enabled = enabled and HAVE_SPEEDUPS


NAMESPACE = {
    "use_speedups": use_speedups,
    "decode": asbp.decode,
    "encode": asbp.encode,
    "parse_qsl": urllib.parse.parse_qsl,
    "urlencode": urllib.parse.urlencode,
    "FRAME": FRAME,
    "QUERY": QUERY,
    "COMMAND": COMMAND,
    "PAIRS": PAIRS,
}


def check() -> None:
    """Both sides must do the work claimed, or the numbers mean nothing."""
    assert asbp.encode(COMMAND) == FRAME
    assert dict(COMMAND.header) == {
        "c": "chat.send",
        "g": ("friends", "country men"),
        "d": ID_D,
        "u": "42",
        "s": ID_S,
        "i": ID_I,
    }
    assert COMMAND.body == BODY
    assert urllib.parse.parse_qsl(QUERY) == PAIRS
    # Each decode row runs the path it names, to the same Command.
    limits = asbp.DEFAULT_LIMITS
    if codec._decode_c is not None:
        sizes = (limits.max_frame_bytes, limits.max_header_bytes, limits.max_keys)
        assert codec._decode_c(FRAME, *sizes, limits.max_list_items) is not None
    assert codec._decode_fast(FRAME, limits) == COMMAND
    for enabled in (True, False):
        use_speedups(enabled)
        assert asbp.decode(FRAME) == COMMAND
    use_speedups(True)


def measure(runs: int, batch_seconds: float) -> list[dict[str, float]]:
    """ns/op of every case, per run."""
    timers = {
        name: timeit.Timer(stmt, setup, globals=NAMESPACE)
        for name, (stmt, setup, _) in CASES.items()
    }
    # Batches long enough to time, short enough that a burst of load on the
    # machine spoils one batch rather than the whole run.
    numbers = {}
    for name, timer in timers.items():
        count, seconds = timer.autorange()
        numbers[name] = max(1, int(count * batch_seconds / seconds))
    names = list(CASES)
    results = []
    for run in range(runs):
        shift = run % len(names)
        result = {}
        for name in names[shift:] + names[:shift]:
            best = min(timers[name].repeat(repeat=3, number=numbers[name]))
            result[name] = best / numbers[name] * 1e9
        results.append(result)
    use_speedups(True)
    return results


def report(results: list[dict[str, float]]) -> None:
    print(f"{'case':<24} {'ns/op':>8} {'min':>8} {'max':>8}")
    for name in CASES:
        times = [result[name] for result in results]
        median, low, high = statistics.median(times), min(times), max(times)
        print(f"{name:<24} {median:>8.0f} {low:>8.0f} {high:>8.0f}")
    print()
    for name, (_, _, baseline) in CASES.items():
        if baseline is not None:
            speed_up = statistics.median(r[baseline] / r[name] for r in results)
            verb = name.removeprefix("asbp.")
            line = f"{verb} speed-up vs {baseline.rpartition('.')[2]}: {speed_up:.2f}x"
            if name in (DEFAULT_DECODE, "asbp.encode"):
                line += " (goal >= 2.00x)"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="interleaved runs (default 7)")
    parser.add_argument("--quick", action="store_true", help="3 short runs: rough numbers")
    args = parser.parse_args()
    runs, batch_seconds = (3, 0.02) if args.quick else (args.runs, 0.1)
    check()
    python = f"{platform.python_implementation()} {platform.python_version()}"
    print(f"Python: {python} on {platform.machine()}")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.2f} > 0.5, the machine is busy: trust the ratios")
    print(f"frame {len(FRAME)} bytes ({FRAME.index(b';')}-byte header), query {len(QUERY)} chars")
    if HAVE_SPEEDUPS:
        print("decode path: the C accelerator (asbp._speedups), pure Python measured beside it")
    else:
        print("decode path: pure Python (asbp._speedups was not built)")
    print(f"{runs} runs, medians of the per-run best\n")
    report(measure(runs, batch_seconds))


if __name__ == "__main__":
    main()
