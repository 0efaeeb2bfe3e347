"""The peers bench/peers.py measures the broker against: installed, started, watched, stopped.

* :func:`install_peers` installs what is missing when the benchmark runs:
  ``nats-server`` and ``rabbitmq-server`` from Debian's packages (apt-get, as
  root), ``nats-py`` and ``aio-pika`` into the running interpreter's
  environment (pip). CI needs no step of its own for them.
* :class:`NatsServer` runs ``nats-server`` on 127.0.0.1 with a port the
  kernel picks (``-p -1``), with JetStream (``-js``, file storage in a private
  directory) or without; it is ready once it logs its client port and
  ``Server is ready``.
* :class:`RabbitNode` runs a private RabbitMQ node in the foreground: its own
  node name, AMQP and distribution ports, and directories (mnesia, logs,
  plugins file, Erlang cookie) under a temporary directory, logging to
  stdout; it is ready once it logs ``started TCP listener`` on its port.
* :func:`cpu_seconds` is the CPU time of a process and every descendant, from
  /proc: what "server CPU per message" sums for each peer.

Every server is started as a child of this process and stopped by its PID
(SIGTERM, then SIGKILL after a grace period); ``epmd``, which the Erlang VM
starts detached, is stopped (``epmd -kill``) only if it was not running
before the node started. Nothing here waits on a timer: start-up waits on the
server's own log lines, with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Final

from tests.support.ports import listen_port

HOST: Final = "127.0.0.1"
APT_PACKAGES: Final = ("nats-server", "rabbitmq-server")
#: Distribution name -> module it provides: the clients on the peers' side.
PIP_PACKAGES: Final = {"nats-py": "nats", "aio-pika": "aio_pika"}
#: Debian's /usr/sbin/rabbitmq-server re-runs itself as the rabbitmq user when
#: started by root, with its own environment; the script it wraps keeps ours.
RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
#: Erlang takes 5-15 s to boot RabbitMQ on this machine; a loaded one, more.
START_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 30.0
HAVE_SCHEDSTAT: Final = os.path.exists("/proc/self/schedstat")
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


# -- installing ----------------------------------------------------------------------


def _missing_commands() -> list[str]:
    missing = []
    if shutil.which("nats-server") is None:
        missing.append("nats-server")
    if not RABBITMQ_SERVER.exists():
        missing.append("rabbitmq-server")
    return missing


def install_peers() -> None:
    """Install the peer servers and their Python clients, if missing.

    Raises:
        RuntimeError: a server is missing and this process cannot apt-get it.
    """
    missing = _missing_commands()
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise RuntimeError(
                f"{', '.join(missing)} missing: run `apt-get install -y {' '.join(missing)}` "
                "as root (Debian's packages), then this benchmark again"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        policy = subprocess.run(
            ["apt-cache", "policy", *missing], capture_output=True, text=True, check=False
        ).stdout
        # An apt-cache that knows no candidate has never read the package lists.
        if "Candidate: (none)" in policy or not re.search(r"Candidate: \S", policy):
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        print(f"installing {', '.join(missing)} (apt-get)", flush=True)
        install = ["apt-get", "install", "-y", "-qq", *missing]
        if subprocess.run(install, check=False, env=env, stdout=subprocess.DEVNULL).returncode:
            # Lists old enough to name versions the mirror no longer has: read them anew.
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
            subprocess.run(install, check=True, env=env, stdout=subprocess.DEVNULL)
    wanted = [name for name, module in PIP_PACKAGES.items() if not importlib.util.find_spec(module)]
    if wanted:
        # Into this interpreter's environment, as `pip install -e '.[bench]'` would.
        print(f"installing {', '.join(wanted)} (pip)", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted],
            check=True,
        )
        importlib.invalidate_caches()


def jetstream_available() -> bool:
    """Whether this nats-server has JetStream (2.2 and later; Debian 12 ships 2.9)."""
    help_text = subprocess.run(
        ["nats-server", "--help"], capture_output=True, text=True, check=False
    )
    return "--jetstream" in help_text.stdout + help_text.stderr


def versions() -> dict[str, str]:
    """The versions of every server and client the comparison involves."""
    found: dict[str, str] = {}
    for package in ("nats-server", "rabbitmq-server", "erlang-base", "redis-server"):
        result = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package],
            capture_output=True,
            text=True,
            check=False,
        )
        found[package] = result.stdout.strip() or "?"
    for distribution in ("nats-py", "aio-pika", "websockets", "uvicorn", "hypercorn", "redis"):
        try:
            found[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[distribution] = "?"
    found["python"] = sys.version.split()[0]
    return found


# -- CPU time from /proc ---------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the Erlang VM's port programs, say)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of ``pids`` so far, every thread, in seconds.

    /proc/<pid>/task/*/schedstat counts nanoseconds on a CPU; utime + stime in
    /proc/<pid>/stat counts clock ticks (10 ms), too coarse for a phase of a
    few hundred operations, so it is the fallback only.
    """
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # a process or thread may just have ended
            if HAVE_SCHEDSTAT:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with (
                        contextlib.suppress(OSError),
                        open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f,
                    ):
                        total += int(f.read().split()[0]) / 1e9
            else:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


#: Starts of a server whose port was taken meanwhile, at most.
_PORT_ATTEMPTS = 3
#: What RabbitMQ says when its distribution port or its listener's is taken.
_PORT_IN_USE = ("already_used", "eaddrinuse")


class _PortTaken(RuntimeError):
    """A port found free was taken before the server bound it."""


async def _stop(process: asyncio.subprocess.Process, name: str) -> None:
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
    except TimeoutError:
        print(f"{name} did not stop on SIGTERM: killed", file=sys.stderr)
        process.kill()
        await process.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read a server's output to its end, so its pipe never fills up."""
    while await stream.readline():
        pass


# -- nats-server -----------------------------------------------------------------------


class NatsServer:
    """``nats-server`` on 127.0.0.1, stock settings; JetStream on file storage if asked."""

    _LISTENING: Final = re.compile(rb"Listening for client connections on [\d.]+:(\d+)")

    def __init__(self, *, jetstream_dir: Path | None = None) -> None:
        self.jetstream_dir = jetstream_dir
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def cpu_seconds(self) -> float:
        return cpu_seconds(descendants(self.pid))

    def schedstat(self) -> tuple[float, float]:
        """As bench/fanout.py's servers: CPU seconds, and (not measured) waiting."""
        return self.cpu_seconds(), 0.0

    async def start(self) -> None:
        args = ["nats-server", "-a", HOST, "-p", "-1"]
        if self.jetstream_dir is not None:
            args += ["-js", "-sd", str(self.jetstream_dir)]
        self.process = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        assert self.process.stderr is not None
        stderr = self.process.stderr
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:
                    line = await stderr.readline()
                    if not line:
                        raise RuntimeError("nats-server exited before it was ready")
                    found = self._LISTENING.search(line)
                    if found:
                        self.port = int(found.group(1))
                    if b"Server is ready" in line and self.port:
                        break
        except BaseException:
            await self.stop()
            raise
        self._drain = asyncio.create_task(_drain(stderr))

    async def stop(self) -> None:
        if self.process is not None:
            await _stop(self.process, "nats-server")
        if self._drain is not None:
            await self._drain


# -- RabbitMQ ----------------------------------------------------------------------------


def _epmd_running() -> bool:
    return (
        shutil.which("epmd") is not None
        and subprocess.run(["epmd", "-names"], capture_output=True, check=False).returncode == 0
    )


class RabbitNode:
    """A private RabbitMQ node, stock settings, in ``directory``; AMQP on 127.0.0.1."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self.node = f"asbp-bench-{uuid.uuid4().hex[:8]}@localhost"
        self._started_epmd = False
        self._drain: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def cpu_seconds(self) -> float:
        """The shell wrapper, the Erlang VM (beam.smp) and its port programs."""
        assert self.process is not None
        return cpu_seconds(descendants(self.process.pid))

    async def start(self) -> None:
        # A port found free may be taken before the VM binds it (an outgoing
        # connection's ephemeral port, on a busy machine): start again on others.
        for attempt in range(_PORT_ATTEMPTS):
            try:
                await self._start()
                return
            except _PortTaken:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise

    async def _start(self) -> None:
        self.port = listen_port()
        base = self.directory
        base.mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[].\n")  # stock: no plugins
        env = {
            **os.environ,
            # The Erlang cookie goes to $HOME: a private one, not root's.
            "HOME": str(base),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(listen_port()),
            "RABBITMQ_BASE": str(base),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # none: stock settings
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_LOGS": "-",  # to stdout, where start-up is waited for
        }
        self._started_epmd = not _epmd_running()
        self.process = await asyncio.create_subprocess_exec(
            str(RABBITMQ_SERVER),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the benchmark goes to it alone
        )
        assert self.process.stdout is not None
        stdout = self.process.stdout
        listening = f"started TCP listener on {HOST}:{self.port}".encode()
        tail: list[bytes] = []
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:
                    line = await stdout.readline()
                    if not line:
                        said = b"".join(tail[-20:]).decode(errors="replace")
                        taken = any(sign in said for sign in _PORT_IN_USE)
                        failure = _PortTaken if taken else RuntimeError
                        raise failure("rabbitmq-server exited before it was ready:\n" + said)
                    tail.append(line)
                    if listening in line:
                        break
        except BaseException:
            await self.stop()
            raise
        self._drain = asyncio.create_task(_drain(stdout))

    async def stop(self) -> None:
        if self.process is not None:
            # The wrapper script turns SIGTERM into a clean stop of the VM it started.
            await _stop(self.process, "rabbitmq-server")
        if self._drain is not None:
            await self._drain
        if self._started_epmd and shutil.which("epmd") is not None:
            subprocess.run(["epmd", "-kill"], capture_output=True, check=False)
