"""A private ``redis-server`` process per test.

Theory of operation
-------------------
Each :class:`RedisServer` owns one port (picked once, kept across restarts) and one data
directory, so ``restart()`` brings back the same server with whatever its append-only
file kept. Nothing is shared with a system Redis or with other tests.

Readiness comes from the server itself: its log goes to stdout, a reader thread reads
it line by line, and ``start()`` waits on an event set when Redis prints "Ready to accept
connections" (or when stdout reaches EOF because Redis exited). The same daemon thread
keeps draining stdout for the life of the process, so the pipe never fills and blocks
Redis; only the last :data:`LOG_LINES` lines are kept, for error messages.

A missing ``redis-server`` is an error, never a skip: a suite that quietly skips its
Redis engine tests reports green while testing half of the gateway.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

from .ports import listen_port
from .timing import T

__all__ = ["LOG_LINES", "READY_MARKER", "RedisServer", "RedisServerError"]

#: How many of Redis's most recent log lines are kept for error messages.
LOG_LINES: Final = 200
#: The log line Redis prints once it listens (Redis 6 and 7 alike).
READY_MARKER: Final = "Ready to accept connections"

_HOST: Final = "127.0.0.1"


class RedisServerError(RuntimeError):
    """``redis-server`` is missing, failed to start, or did not stop."""


class RedisServer:
    """A ``redis-server`` on a free loopback port, with its own data directory.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        directory: where Redis keeps its files (e.g. pytest's ``tmp_path``).
        appendonly: enable the AOF with ``appendfsync always``, so every acknowledged
            write survives :meth:`kill` and :meth:`restart`.
        appendfsync: the AOF's fsync policy when ``appendonly``: ``always`` (the
            default) or ``everysec`` (what most deployments run: on a full disk
            Redis refuses writes until it can append again, where ``always`` exits).
        executable: the program to look up on ``PATH``.
        options: more ``redis-server`` arguments (a cluster node's, say), appended.
    """

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        appendfsync: str = "always",
        executable: str = "redis-server",
        options: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.executable = executable
        self.options = tuple(options)
        self.port = listen_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._log: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self._log_lock = threading.Lock()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The running server's process id.

        Raises:
            RedisServerError: the server is not running.
        """
        if self._process is None:
            raise RedisServerError("redis-server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the server was started and has not been stopped or killed by us."""
        return self._process is not None

    @property
    def log(self) -> tuple[str, ...]:
        """The most recent log lines, oldest first."""
        with self._log_lock:
            return tuple(self._log)

    def start(self, timeout: float = 10 * T) -> None:
        """Start Redis and return once it accepts connections.

        Raises:
            RedisServerError: already running, not on ``PATH``, exited during startup, or
                not ready within ``timeout`` seconds (the process is then killed).
        """
        if self._process is not None:
            raise RedisServerError("redis-server is already running")
        path = shutil.which(self.executable)
        if path is None:
            raise RedisServerError(
                f"{self.executable!r} was not found on PATH. The tests need a real Redis; "
                "install it (e.g. `apt-get install redis-server`)."
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            self._command(path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
        )
        assert process.stdout is not None  # stdout=PIPE
        ready = threading.Event()
        settled = threading.Event()
        reader = threading.Thread(
            target=self._drain,
            args=(process.stdout, ready, settled),
            name=f"redis-server:{self.port} stdout",
            daemon=True,
        )
        reader.start()
        self._process, self._reader = process, reader

        if not settled.wait(timeout):
            self._terminate(signal.SIGKILL, timeout)
            raise RedisServerError(f"redis-server was not ready within {timeout:g}s{self._tail()}")
        if not ready.is_set():
            self._terminate(signal.SIGKILL, timeout)
            raise RedisServerError(
                f"redis-server exited during startup (status {process.returncode}){self._tail()}"
            )

    def stop(self, timeout: float = 10 * T) -> None:
        """Stop Redis with SIGTERM, escalating to SIGKILL after ``timeout``; wait for it.

        Does nothing if Redis is not running.
        """
        self._terminate(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 10 * T) -> None:
        """Kill Redis with SIGKILL and reap it, as a crash would."""
        self._terminate(signal.SIGKILL, timeout)

    def wait(self, timeout: float = 10 * T) -> int:
        """Wait for Redis to exit by itself (a fatal error); its exit status.

        Raises:
            RedisServerError: not running, or still running after ``timeout`` seconds.
        """
        if self._process is None:
            raise RedisServerError("redis-server is not running")
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RedisServerError(
                f"redis-server still runs after {timeout:g}s{self._tail()}"
            ) from None

    def restart(self, timeout: float = 10 * T) -> None:
        """Stop Redis if it runs, then start it on the same port and directory."""
        self.stop(timeout)
        self.start(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _command(self, path: str) -> list[str]:
        command = [
            path,
            "--port", str(self.port),
            "--bind", _HOST,
            "--protected-mode", "no",
            "--dir", str(self.directory),
            "--save", "",
            "--logfile", "",  # stdout
            "--daemonize", "no",
        ]  # fmt: skip
        if self.appendonly:
            command += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            command += ["--appendonly", "no"]
        return command + list(self.options)

    def _drain(self, stdout: IO[bytes], ready: threading.Event, settled: threading.Event) -> None:
        with stdout:
            for raw in stdout:
                line = raw.decode(errors="replace").rstrip()
                with self._log_lock:
                    self._log.append(line)
                if not ready.is_set() and READY_MARKER in line:
                    ready.set()
                    settled.set()
        settled.set()  # EOF: Redis exited (or closed stdout) before or after readiness

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        process, reader = self._process, self._reader
        if process is None or reader is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        # Stdout reaches EOF once Redis is gone, unless a forked child (an AOF rewrite)
        # still holds it.
        reader.join(timeout)
        if reader.is_alive():
            raise RedisServerError(f"redis-server:{self.port} stdout stayed open after exit")
        self._process = self._reader = None

    def _tail(self, lines: int = 20) -> str:
        tail = self.log[-lines:]
        return ":\n" + "\n".join(tail) if tail else ""
