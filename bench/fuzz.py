"""Coverage-guided fuzzing (atheris, libFuzzer) of every way bytes enter the broker.

    python bench/fuzz.py                        # 1,000,000 inputs over the targets
    python bench/fuzz.py --total 200000         # fewer
    python bench/fuzz.py --quick                # 2,000 per target: a smoke run
    python bench/fuzz.py --targets http --runs 50000 --out /tmp/fuzz

Targets, each fuzzed in a process of its own (libFuzzer runs once per process):

==============  ===============================================================
decode-c        ``asbp.decode`` with the C accelerator (asbp/_speedups.c) trying
                first; every answer is checked against the pure path's (the same
                Command, or the same fault code): a disagreement counts as a failure
decode-pure     ``asbp.decode`` with the accelerator off: the pure-Python fast
                path and the reference parser
http            the broker's ASGI application (``gateway.app.create_app``, the
                memory engine) driven directly with ``POST /asbp``: the input is
                the body, its first byte choosing whether an open HTTP Channel's
                ``i`` is put in front, whether the body comes in several chunks and
                whether a query string is cut off its start
websocket       the same application's ``/asbp`` WebSocket endpoint: one Channel
                kept open (opened again whenever the broker closes it), each input
                one message, text or binary as its first byte says
parse_qsl       the baseline: ``urllib.parse.parse_qsl`` on the same bytes, the
                standard library's reader of the same ``key=value,`` shape
==============  ===============================================================

A *failure* is an exception that is not in the ASBP error tree
(``asbp.AsbpError``) escaping the target, an HTTP status of 500 or more, a
WebSocket closed with 1011, a message the broker did not finish with within
5 s, or (decode-c) a disagreement with the pure path. Each distinct failure
(its type and where it was raised) is counted and its first input saved under
``--out`` as ``<target>-<n>.bin``, with the traceback beside it; the run goes on.
The exit status is 1 when any target failed.

Inputs/s includes atheris' coverage instrumentation of ``asbp`` and ``gateway``
(the broker runs several times slower instrumented than in production): it says
how far a given budget goes, not how fast the broker is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("decode-c", "decode-pure", "http", "websocket", "parse_qsl")
#: Share of --total per target: the decoder is where every byte goes first.
SHARES = {"decode-c": 0.35, "decode-pure": 0.35, "http": 0.15, "websocket": 0.15}
#: Not in the default run: a target that fails on purpose, to show a failure is caught.
CANARY = "canary"
#: Seconds the broker may take over one input before it counts as a hang.
HANG = 5.0
#: Longest input libFuzzer makes (the header limit is 8 KiB; bodies may be longer).
MAX_LEN = 16_384

#: Tokens of the grammar and the broker's vocabulary, for libFuzzer's mutations.
DICTIONARY = [
    b"c=", b"u=", b"i=", b"d=", b"s=", b"g=", b"a=", b"b=", b"e=", b"f=", b"m=",
    b"o=", b"p=", b"r=", b"t=", b"z=", b"+", b";", b",", b"'", b"[", b"]", b"=",
    b"asbp.channel", b"asbp.publish", b"asbp.subscribe", b"asbp.unsubscribe",
    b"asbp.poll", b"asbp.ack", b"asbp.ping", b"asbp.subject", b"asbp.close",
    b"asbp.fault", b"asbp.register", b"/topic/a", b"/queue/q", b"ping", b"echo",
    b"0123456789abcdef0123456789abcdef", b"\xc3\xa9", b"\xff", b"\r\n", b"65535",
]  # fmt: skip
SEEDS = [
    b"c=ping;",
    b"c=echo,u=1;hello",
    b"c=asbp.channel;",
    b"c=asbp.subscribe,t=/topic/a,u=2;",
    b"c=asbp.publish,t=/topic/a,u=3;payload",
    b"c=asbp.publish,q=/queue/q,u=4;x",
    b"c=asbp.poll,q=/queue/q,u=5;",
    b"+c=caf\xc3\xa9,u=6;",
    b"c=chat.send,g=[friends,'country men'],d=0123456789abcdef0123456789abcdef,u=7;b",
    b"+u=5,c=x\xff;",
    b"\x01c=asbp.ping,u=9;",
]


# -- the parent: one process per target, then the table -------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=1_000_000, help="inputs over all targets")
    parser.add_argument("--runs", type=int, help="inputs per target (instead of --total)")
    parser.add_argument("--quick", action="store_true", help="2,000 inputs per target")
    parser.add_argument("--targets", nargs="+", choices=(*TARGETS, CANARY))
    parser.add_argument("--out", type=Path, help="where reports and failing inputs go")
    parser.add_argument("--worker", choices=(*TARGETS, CANARY), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        assert args.runs is not None and args.out is not None
        return _work(args.worker, args.runs, args.out)
    targets = args.targets or TARGETS
    out = args.out or Path(tempfile.mkdtemp(prefix="asbp-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    reports = [_run_worker(target, _count(target, args), out) for target in targets]
    return _print(reports, out)


def _count(target: str, args: argparse.Namespace) -> int:
    if args.runs is not None:
        return int(args.runs)
    if args.quick:
        return 2_000
    # The baseline and the canary get what one decode path gets, beside the total.
    return int(args.total * SHARES.get(target, SHARES["decode-pure"]))


def _run_worker(target: str, runs: int, out: Path) -> dict[str, Any]:
    report = out / f"{target}.json"
    report.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--worker", target, "--runs", str(runs), "--out", str(out)]
    print(f"{target}: {runs:,} inputs ...", flush=True)
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if not report.exists():
        # libFuzzer itself stopped (out of memory, a native crash): the worst failure.
        (out / f"{target}.log").write_text(done.stdout + done.stderr)
        return {
            "target": target,
            "inputs": 0,
            "seconds": 0.0,
            "failures": 1,
            "signatures": {"worker died": {"count": 1, "file": f"{target}.log"}},
            "outcomes": {},
        }
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def _print(reports: list[dict[str, Any]], out: Path) -> int:
    print()
    print(f"{'target':<12} {'inputs':>10} {'seconds':>8} {'inputs/s':>9} {'failures':>8}")
    total = failures = 0
    rates = {}
    for r in reports:
        rate = r["inputs"] / r["seconds"] if r["seconds"] else 0.0
        rates[r["target"]] = rate
        total += r["inputs"]
        failures += r["failures"]
        print(
            f"{r['target']:<12} {r['inputs']:>10,} {r['seconds']:>8.1f} {rate:>9,.0f}"
            f" {r['failures']:>8}"
        )
    print(f"{'total':<12} {total:>10,} {'':>8} {'':>9} {failures:>8}")
    for r in reports:
        if r["outcomes"]:
            common = ", ".join(f"{k} {v:,}" for k, v in Counter(r["outcomes"]).most_common(6))
            print(f"  {r['target']} outcomes: {common}")
        for signature, seen in r["signatures"].items():
            print(f"  FAILURE {r['target']}: {signature} x{seen['count']} -> {out / seen['file']}")
    baseline = rates.get("parse_qsl")
    if baseline:
        for target in ("decode-c", "decode-pure"):
            if rates.get(target):
                print(f"ratio {target} / parse_qsl inputs/s: {rates[target] / baseline:.2f}")
    print(f"non-protocol exceptions and other failures: {failures} (reports in {out})")
    return 1 if failures else 0


# -- a worker: one target under atheris -----------------------------------------------


class Book:
    """What one worker saw: inputs, outcomes and distinct failures (first input saved)."""

    def __init__(self, target: str, runs: int, out: Path) -> None:
        self.target, self.runs, self.out = target, runs, out
        self.inputs = 0
        self.outcomes: Counter[str] = Counter()
        self.signatures: dict[str, dict[str, Any]] = {}
        self.began = time.perf_counter()

    def failed(self, data: bytes, why: str, detail: str) -> None:
        seen = self.signatures.get(why)
        if seen is None:
            name = f"{self.target}-{len(self.signatures)}.bin"
            (self.out / name).write_bytes(data)
            (self.out / f"{name}.txt").write_text(f"{why}\n\n{detail}\n")
            seen = self.signatures[why] = {"count": 0, "file": name}
        seen["count"] += 1

    def exception(self, data: bytes, exc: BaseException) -> None:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        why = f"{type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"
        self.failed(data, why, "".join(traceback.format_exception(exc)))

    def save(self) -> None:
        report = {
            "target": self.target,
            "inputs": self.inputs,
            "seconds": time.perf_counter() - self.began,
            "failures": sum(s["count"] for s in self.signatures.values()),
            "signatures": self.signatures,
            "outcomes": dict(self.outcomes),
        }
        (self.out / f"{self.target}.json").write_text(json.dumps(report, indent=1))


def _work(target: str, runs: int, out: Path) -> int:
    import atheris  # the bench extra

    with atheris.instrument_imports(include=["asbp", "gateway"]):
        import asbp  # noqa: F401
        import gateway.app  # noqa: F401

    book = Book(target, runs, out)
    one = {
        "decode-c": _decode_target(book, checked=True),
        "decode-pure": _decode_target(book, checked=False),
        "parse_qsl": _parse_qsl_target(book),
        "http": None,
        "websocket": None,
        CANARY: _canary_target(book),
    }[target]
    finish: Callable[[], None] = lambda: None  # noqa: E731
    if one is None:
        one, finish = _broker_target(book, websocket=target == "websocket")

    def test_one_input(data: bytes) -> None:
        book.inputs += 1
        try:
            one(data)
        except Exception as exc:
            book.exception(data, exc)
        if book.inputs >= runs:
            try:
                finish()
            except Exception as exc:
                book.exception(b"", exc)
            book.save()
            # libFuzzer has no way to stop after N inputs of ours (its -runs also
            # counts the seeds it loads), so the worker leaves here.
            os._exit(0)

    work = Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-", dir=out))
    corpus = work / "corpus"
    corpus.mkdir()
    for n, seed in enumerate(SEEDS):
        (corpus / f"seed-{n}").write_bytes(seed)
    dictionary = work / "asbp.dict"
    dictionary.write_text("".join(f'"{_dict_escape(token)}"\n' for token in DICTIONARY))
    argv = [
        sys.argv[0],
        f"-runs={runs * 2 + 1000}",
        f"-max_len={MAX_LEN}",
        f"-dict={dictionary}",
        "-rss_limit_mb=4096",
        "-print_final_stats=0",
        str(corpus),
    ]
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()
    book.save()  # only if libFuzzer stopped first
    return 0


def _dict_escape(token: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in token)


def _decode_target(book: Book, *, checked: bool) -> Callable[[bytes], None]:
    import asbp
    from asbp import codec

    have_c = codec._decode_c is not None

    def pure(data: bytes) -> asbp.Command | int:
        codec.speedups_enabled = False
        try:
            return asbp.decode(data)
        except asbp.ProtocolError as exc:
            return int(exc.code)

    def one(data: bytes) -> None:
        if not checked:
            outcome = pure(data)
            book.outcomes["fault" if isinstance(outcome, int) else "decoded"] += 1
            return
        codec.speedups_enabled = have_c
        try:
            fast: asbp.Command | int = asbp.decode(data)
        except asbp.ProtocolError as exc:
            fast = int(exc.code)
        book.outcomes["fault" if isinstance(fast, int) else "decoded"] += 1
        reference = pure(data)
        if fast != reference:
            book.failed(data, "C and pure paths disagree", f"C: {fast!r}\npure: {reference!r}")

    if checked and not have_c:
        raise SystemExit("decode-c: asbp._speedups was not built here")
    return one


def _parse_qsl_target(book: Book) -> Callable[[bytes], None]:
    import urllib.parse

    def one(data: bytes) -> None:
        try:
            urllib.parse.parse_qsl(data.decode("latin-1"), strict_parsing=True)
        except ValueError:
            book.outcomes["refused"] += 1
        else:
            book.outcomes["read"] += 1

    return one


def _canary_target(book: Book) -> Callable[[bytes], None]:
    def one(data: bytes) -> None:
        book.outcomes["seen"] += 1
        if len(data) % 2:
            raise LookupError("the canary: odd lengths fail on purpose")

    return one


def _broker_target(
    book: Book, *, websocket: bool
) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """The broker's ASGI app, its lifespan started in a loop this worker keeps."""
    from gateway.app import create_app
    from gateway.config.model import GatewayConfig

    data_dir = Path(tempfile.mkdtemp(prefix="fuzz-broker-", dir=book.out))
    config = GatewayConfig(broker_id="f" * 32, data_dir=data_dir)
    app = create_app(config)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    lifespan = Lifespan(app)
    loop.run_until_complete(lifespan.start())
    driver: HttpDriver | WebSocketDriver
    driver = WebSocketDriver(app, lifespan.state) if websocket else HttpDriver(app, lifespan.state)

    def one(data: bytes) -> None:
        try:
            outcome = loop.run_until_complete(asyncio.wait_for(driver.feed(data), HANG))
        except TimeoutError:
            book.failed(data, "no answer within 5 s", "the broker hung on this input")
            driver.reset()
            return
        if outcome.startswith("FAIL "):
            book.failed(data, outcome[5:], outcome)
        else:
            book.outcomes[outcome] += 1

    def finish() -> None:
        loop.run_until_complete(driver.close())
        loop.run_until_complete(lifespan.stop())

    return one, finish


class Lifespan:
    """The ASGI lifespan protocol, as a server speaks it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._said: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, self._said.put))
        await self._inbox.put({"type": "lifespan.startup"})
        said = await self._said.get()
        if said["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the broker did not start: {said}")

    async def stop(self) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        said = await self._said.get()
        if said["type"] != "lifespan.shutdown.complete":
            raise RuntimeError(f"the broker did not stop cleanly: {said}")
        assert self._task is not None
        await self._task


def _scope(kind: str, state: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "path": "/asbp",
        "raw_path": b"/asbp",
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        # As servers do: each connection gets a shallow copy of the lifespan's state.
        "state": dict(state),
        **more,
    }


class HttpDriver:
    """One ``POST /asbp`` per input."""

    def __init__(self, app: Any, state: dict[str, Any]) -> None:
        self.app, self.state = app, state
        self.channel_id: bytes | None = None

    def reset(self) -> None:
        self.channel_id = None

    async def close(self) -> None:
        pass

    async def feed(self, data: bytes) -> str:
        mode, body = (data[0], data[1:]) if data else (0, b"")
        query = b""
        if mode & 4:
            query, _, body = body.partition(b"\n")
        if mode & 1:
            channel_id = await self._channel()
            at = 1 if body.startswith(b"+") else 0
            body = body[:at] + b"i=" + channel_id + b"," + body[at:]
        chunks = [body]
        if mode & 2 and len(body) > 2:
            cut = 1 + (mode >> 4) * len(body) // 16
            chunks = [body[:cut], body[cut:]]
        status, _ = await self._post(body if len(chunks) == 1 else chunks, query)
        if status >= 500:
            return f"FAIL HTTP {status}"
        if status == 410:
            self.channel_id = None  # the mailbox filled and was closed, or it expired
        return f"HTTP {status}"

    async def _channel(self) -> bytes:
        broker = self.state["broker"]
        if self.channel_id is None or broker.channels.get(self.channel_id.decode()) is None:
            status, answer = await self._post(b"c=asbp.channel;", b"")
            assert status == 200, (status, answer)
            header = answer.partition(b";")[0]
            pairs = dict(pair.split(b"=", 1) for pair in header.split(b","))
            self.channel_id = pairs[b"i"]
        return self.channel_id

    async def _post(self, body: bytes | list[bytes], query: bytes) -> tuple[int, bytes]:
        chunks = body if isinstance(body, list) else [body]
        size = sum(map(len, chunks))
        headers = [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/asbp"),
            (b"content-length", str(size).encode()),
        ]
        scope = _scope("http", self.state, method="POST", scheme="http", headers=headers)
        scope["query_string"] = query
        messages = [
            {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
            for n, chunk in enumerate(chunks)
        ]
        disconnected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await disconnected.wait()  # as a server does once the body is read
            return {"type": "http.disconnect"}

        status, answer = 0, []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                answer.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        finally:
            disconnected.set()
        return status, b"".join(answer)


class WebSocketDriver:
    """One ``/asbp`` WebSocket Channel, opened again when the broker closes it; one
    message per input."""

    def __init__(self, app: Any, state: dict[str, Any]) -> None:
        self.app, self.state = app, state
        self._task: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting = asyncio.Event()
        self._closed: int | None = None
        self.frames = 0

    def reset(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task = None

    async def _open(self) -> None:
        self._inbox = inbox = asyncio.Queue[dict[str, Any]]()
        self._waiting = waiting = asyncio.Event()
        self._closed = None
        inbox.put_nowait({"type": "websocket.connect"})
        scope = _scope(
            "websocket",
            self.state,
            scheme="ws",
            headers=[(b"host", b"127.0.0.1:8080")],
            subprotocols=[],
            extensions={"websocket.http.response": {}},
        )

        async def receive() -> dict[str, Any]:
            if inbox.empty():
                waiting.set()  # the endpoint has routed everything it was given
            message = await inbox.get()
            waiting.clear()
            return message

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.close":
                self._closed = message.get("code", 1000)
                waiting.set()
            elif message["type"] == "websocket.send":
                self.frames += 1

        self._task = asyncio.create_task(self.app(scope, receive, send))
        await waiting.wait()

    async def feed(self, data: bytes) -> str:
        if self._task is None or self._task.done() or self._closed is not None:
            if self._task is not None and self._task.done() and not self._task.cancelled():
                self._task.result()  # raises what the endpoint raised, if it did
            await self._open()
        mode, body = (data[0], data[1:]) if data else (0, b"")
        self._waiting.clear()
        message: dict[str, Any]
        if mode & 1:
            message = {"type": "websocket.receive", "text": body.decode("utf-8", "replace")}
        else:
            message = {"type": "websocket.receive", "bytes": body}
        self._inbox.put_nowait(message)
        await self._waiting.wait()
        assert self._task is not None
        if self._closed is not None:
            if self._closed == 1011:
                return "FAIL WebSocket closed with 1011"
            await self._end()
            return f"closed {self._closed}"
        return "routed"

    async def _end(self) -> None:
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        assert self._task is not None
        await self._task

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            await self._end()


if __name__ == "__main__":
    sys.exit(main())
