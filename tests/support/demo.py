"""``asbp demo`` as a user runs it (a broker and the example agent), on a free port, restartable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.timing import T

__all__ = ["READY_LINE", "Demo"]

ROOT = Path(__file__).resolve().parents[2]
#: The demo prints this once the broker and the example agent are both ready.
READY_LINE = "The ASBP demo is running"


@dataclass
class Demo:
    """One ``asbp demo`` process (a broker and the example agent), restartable."""

    port: int
    data_dir: Path
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "gateway.ops.cli", "demo"),
                *("--port", str(self.port), "--data-dir", str(self.data_dir)),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()
        process = self.process

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                self.output.append(line)
                if READY_LINE in line:
                    ready.set()
            ready.set()  # exited: the wait below returns and the check fails

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(30 * T) or process.poll() is not None:
            self.stop()
            raise RuntimeError("asbp demo did not start:\n" + "".join(self.output))

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20 * T)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.reader is not None:
            self.reader.join(10 * T)  # EOF follows the exit
        assert process.stdout is not None
        process.stdout.close()
