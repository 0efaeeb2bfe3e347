"""The README's run command: the demo broker and example agent, driven as the
README shows a newcomer, with curl; and stopped, at any moment, leaving nothing behind.

The demo prints a line as it enters each phase ("starting a broker", "example agent:
pid N", the banner); a test waits for that line (a reader thread, a queue, a deadline)
and signals the demo right then.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support import T

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[str]:
    """Run ``asbp demo`` on a free port; yield its base URL."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gateway.ops.cli import main; sys.exit(main())",
            "demo",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "demo"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        base = None
        # The banner comes once the broker listens and the agent has registered.
        for line in process.stdout:
            match = re.search(r"a broker at (http://127\.0\.0\.1:\d+)", line)
            if match:
                base = match.group(1)
                break
        assert base is not None, "the demo never printed its banner"
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=20 * T) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def _curl(*args: str) -> str:
    done = subprocess.run(
        ["curl", "-s", "--max-time", str(10 * T), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_readme_shows_the_two_commands_first() -> None:
    first_block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["bash scripts/run", "bash scripts/test"]


def test_a_newcomer_gets_the_agents_reply_with_curl(demo: str) -> None:
    send = "curl -s -d 'c=echo,u=1;hello' http://127.0.0.1:8080/asbp"
    poll = "curl -s -H 'ASBP-Secret: "
    assert send in README and poll in README

    accepted = _curl("-d", "c=echo,u=1;hello", f"{demo}/asbp")
    match = re.fullmatch(
        r"c=asbp\.accepted,i=([0-9a-f]{32}),b=[^,;]+,u=1,secret=([A-Za-z0-9_-]{43});", accepted
    )
    assert match, accepted
    secret = f"ASBP-Secret: {match.group(2)}"
    answer = _curl("-H", secret, f"{demo}/asbp?i={match.group(1)}&wait={5 * T}")
    assert "ASBP-Seq: 1" in answer
    # curl output read as text: the parts' CRLFs arrive as newlines.
    assert "\nc=echo.reply,u=1,a=echo;hello\n" in answer


class Demo:
    """``asbp demo --port 0`` as a process, its output lines read by threads into a queue."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from gateway.ops.cli import main; sys.exit(main())",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [
            threading.Thread(target=self._drain, args=(self.process.stdout, self.stdout, True)),
            threading.Thread(target=self._drain, args=(self.process.stderr, self.stderr, False)),
        ]
        for thread in self._threads:
            thread.start()

    def _drain(self, stream: IO[str], sink: list[str], feed: bool) -> None:
        with stream:
            for line in stream:
                sink.append(line)
                if feed:
                    self._lines.put(line)
        if feed:
            self._lines.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The next line of standard output that matches ``pattern``."""
        deadline = time.monotonic() + 20 * T
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r}: {self.output}") from None
            assert line is not None, f"the demo exited first: {self.output}"
            if match := re.search(pattern, line):
                return match

    def wait(self, timeout: float) -> int:
        returncode = self.process.wait(timeout)
        for thread in self._threads:
            thread.join(timeout)
        return returncode

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait(10 * T)


def gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (the demo reaped its agent, or never had one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


#: "Exits within a few seconds": the agent's own grace is 5 s, and a prompt stop
#: needs none of it.
STOP_BUDGET = 3.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("moment", ["broker starting", "agent starting", "running"])
def test_a_stop_at_any_moment_is_prompt_and_leaves_nothing(
    tmp_path: Path, moment: str, signum: signal.Signals, record_property: Any
) -> None:
    demo = Demo(tmp_path, "demo", "--port", "0", "--data-dir", "demo")
    try:
        demo.wait_for(r"^starting a broker on 127\.0\.0\.1:0 ")
        agent = None
        if moment != "broker starting":
            agent = int(demo.wait_for(r"^example agent: pid (\d+), ").group(1))
        if moment == "running":
            demo.wait_for(r"a broker at http://127\.0\.0\.1:\d+ ")

        demo.process.send_signal(signum)
        started = time.monotonic()
        returncode = demo.wait(20 * T)
        took = time.monotonic() - started
        record_property("stop_seconds", round(took, 3))

        assert returncode == 0, demo.output
        assert "Traceback" not in demo.output
        assert took < STOP_BUDGET * T, f"{took:.2f} s to stop:\n{demo.output}"
        if agent is not None:
            assert gone(agent), f"the agent (pid {agent}) outlived the demo"
        if moment == "broker starting":
            assert "example agent" not in demo.output  # a stop before ready starts none
    finally:
        demo.close()


@pytest.mark.parametrize("args", [["demo"], []], ids=["asbp demo", "bare asbp"])
def test_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path, args: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = Demo(tmp_path, *args, "--port", str(port), "--data-dir", "demo")
        try:
            assert demo.wait(20 * T) == 1
        finally:
            demo.close()

    lines = "".join(demo.stderr).splitlines()
    assert len(lines) == 1, demo.output
    assert " critical gateway.ops.cli: cannot start " in lines[0]
    # The same message as `asbp broker` (tests/gateway/ops/test_cli.py), in the demo's text format.
    assert lines[0].endswith(f'error="cannot listen on 127.0.0.1:{port}: Address already in use"')
    assert "example agent" not in demo.output
