"""The README's run command: the demo broker and example agent, driven as the
README shows a newcomer, with curl."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import T

ROOT = Path(__file__).resolve().parents[1]
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
    poll = "curl -s 'http://127.0.0.1:8080/asbp?i="
    assert send in README and poll in README

    accepted = _curl("-d", "c=echo,u=1;hello", f"{demo}/asbp")
    match = re.fullmatch(r"c=asbp\.accepted,i=([0-9a-f]{32}),b=[^,;]+,u=1;", accepted)
    assert match, accepted
    answer = _curl(f"{demo}/asbp?i={match.group(1)}&wait={5 * T}")
    assert "ASBP-Seq: 1" in answer
    # curl output read as text: the parts' CRLFs arrive as newlines.
    assert "\nc=echo.reply,u=1,a=echo;hello\n" in answer
