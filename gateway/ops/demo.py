"""``asbp demo``: a broker and the example Application-Agent, ready to try.

It keeps everything in one folder (``.asbp-demo`` by default): the broker's
identity and a key pair for the example agent ``echo``, made on first run.
The agent connects over a plain-text Tube, which the broker accepts only
because the demo listens on loopback with ``insecure_dev_tubes``: a
development convenience that the broker refuses anywhere else.

Theory of operation
-------------------
The agent is ``agents/examples/echo_agent.py``, run as ``python -m
agents.examples.echo_agent``: it ships inside the package, so the demo works
from an installed wheel as from a checkout (``examples/echo_agent.py`` is the
same file, for people to read).

The demo goes through three phases (broker starting, agent starting, running),
and a stop (SIGINT, SIGTERM or SIGHUP) may come in any of them. Each phase
waits for its own outcome *or* the stop, never for its outcome alone, so a stop
is honoured at once wherever it lands: the agent is told to leave (SIGTERM,
then SIGKILL after :data:`AGENT_GRACE` seconds) and reaped, then the broker
stops. The agent runs in a session of its own, so a Ctrl-C in the terminal
reaches only the demo, which then stops the agent in order; a signal reaching
the agent while it is still importing would otherwise end it with a
KeyboardInterrupt traceback. Its standard error is read to the end and copied
to the demo's, so a full pipe can never block it.

A process killed with SIGKILL cannot clean up; its agent then keeps trying to
reconnect until stopped by hand (its PID is printed at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, Final

from agents.credentials import generate_agent_key
from gateway.config.model import GatewayConfig

__all__ = ["AGENT", "AGENT_GRACE", "AGENT_MODULE", "READY_TIMEOUT", "SIGN_IN", "demo"]

#: The example agent's identity.
AGENT: Final = "echo"
#: The example agent's module, inside the package (see the module docstring).
AGENT_MODULE: Final = "agents.examples.echo_agent"
#: Seconds the example agent gets to connect and register before the demo gives up.
READY_TIMEOUT: Final = 20.0
#: Seconds the example agent gets to unregister and leave once told to stop.
AGENT_GRACE: Final = 5.0
#: The demo's Authenticate-Command, served by the example agent (the page's Subjects).
SIGN_IN: Final = "auth.login"

# SIGHUP too: closing the terminal should stop the agent, not orphan it.
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _agent_keys(data_dir: Path) -> tuple[Path, Path]:
    """The example agent's key pair in ``data_dir``, made once."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key, pem = data_dir / f"{AGENT}.key", data_dir / f"{AGENT}.pem"
    if not key.exists() or not pem.exists():
        private, public = generate_agent_key()
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(private)
        pem.write_text(public)
    return key, pem


def _banner(base: str) -> str:
    return f"""
The ASBP demo is running: a broker at {base} and the example agent, which
serves `echo`, `clock` and sign-ins. Open {base}/ in a browser for the demo
page, or try it from another terminal:

  # a stateless HTTP Channel: send a Command, then long-poll for the answer
  # with the Channel's i and secret from the first answer
  curl -s -d 'c=echo,u=1;hello' {base}/asbp
  curl -s -H 'ASBP-Secret: <secret>' '{base}/asbp?i=<i>&wait=5'

  # or a WebSocket Channel, with websocat, then type: c=echo,u=1;hello
  websocat {base.replace("http", "ws", 1)}/asbp

Ctrl-C stops both.
"""


def _say(text: str, *, error: bool = False) -> None:
    print(text, file=sys.stderr if error else sys.stdout, flush=True)


async def _spawn_agent(base: str, key: Path) -> asyncio.subprocess.Process:
    tube = base.replace("http", "ws", 1) + "/tube"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        AGENT_MODULE,
        *("--url", tube, "--identity", AGENT, "--key-file", str(key), "--sign-in", SIGN_IN),
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # see the module docstring
    )
    _say(f"example agent: pid {process.pid}, connecting to {tube}")
    return process


async def _read_until_serving(process: asyncio.subprocess.Process, log: list[bytes]) -> bool:
    """True once the agent says it serves; False if it closed standard error first."""
    assert process.stderr is not None
    while line := await process.stderr.readline():
        log.append(line)
        if line.startswith(b"serving"):
            return True
    return False


async def _copy_stderr(process: asyncio.subprocess.Process) -> None:
    assert process.stderr is not None
    while line := await process.stderr.readline():
        sys.stderr.buffer.write(line)
        sys.stderr.flush()


async def _stop_agent(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after :data:`AGENT_GRACE` seconds; reaped either way."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(AGENT_GRACE):
                await process.wait()
        except TimeoutError:
            process.kill()
    await process.wait()


async def _first(stop: asyncio.Event, *tasks: asyncio.Future[Any]) -> None:
    """Return when one of ``tasks`` is done or ``stop`` is set."""
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopping, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def _run(config: GatewayConfig, key: Path) -> int:
    from gateway.ops.server import serve

    stop = asyncio.Event()
    # The broker's own stop comes after the agent's: the agent unregisters and leaves
    # while its broker still answers, rather than finding its Tube closed under it.
    stop_broker = asyncio.Event()
    ready = asyncio.Event()
    base_url: list[str] = []
    loop = asyncio.get_running_loop()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)

    def on_ready(url: str) -> None:
        base_url.append(url)
        ready.set()

    _say(f"starting a broker on {config.host}:{config.port} (data in {config.data_dir})")
    server = asyncio.create_task(serve(config, ready=on_ready, shutdown_trigger=stop_broker.wait))
    agent: asyncio.subprocess.Process | None = None
    copying: asyncio.Task[None] | None = None
    helpers: list[asyncio.Task[Any]] = []
    try:
        # 1. The broker starts (or fails to: serve() raises, and so does this).
        broker_ready = asyncio.create_task(ready.wait())
        helpers.append(broker_ready)
        await _first(stop, server, broker_ready)
        if server.done():
            server.result()
            return 0  # stopped before it was ready
        if stop.is_set():
            return 0

        # 2. The agent starts: it registers, dies, takes too long, or a stop comes.
        agent = await _spawn_agent(base_url[0], key)
        log: list[bytes] = []
        serving = asyncio.create_task(_read_until_serving(agent, log))
        helpers.append(serving)
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await _first(stop, serving, server)
        except TimeoutError:
            _say(f"the example agent did not register within {READY_TIMEOUT:g} s", error=True)
            return 1
        if stop.is_set() or server.done():
            return 0
        if not serving.result():
            await agent.wait()
            _say(f"the example agent exited ({agent.returncode}) before it was ready:", error=True)
            sys.stderr.buffer.write(b"".join(log))
            return 1
        copying = asyncio.create_task(_copy_stderr(agent))
        helpers.append(copying)
        _say(_banner(base_url[0]))

        # 3. Running, until a stop (or the agent dies: the demo is nothing without it).
        exited = asyncio.create_task(agent.wait())
        helpers.append(exited)
        await _first(stop, exited, server)
        if exited.done() and not stop.is_set():
            _say(f"the example agent exited ({agent.returncode}); stopping", error=True)
            return 1
        return 0
    finally:
        if agent is not None:
            await _stop_agent(agent)
            if copying is not None:
                # Its last words ("no longer serving") are on their way: EOF follows
                # its exit unless something it started still holds the pipe.
                await asyncio.wait([copying], timeout=AGENT_GRACE)
        await _cancel(helpers)
        stop_broker.set()
        await server


def demo(port: int = 8080, data_dir: Path = Path(".asbp-demo")) -> int:
    """Run the demo until SIGINT, SIGTERM or SIGHUP; return the exit status.

    Raises:
        ServerError: the broker cannot listen or fails to start.
        ConfigError: the broker identity cannot be kept in ``data_dir``.
    """
    from gateway.ops.logs import configure_logging
    from gateway.ops.loops import run as run_on_loop

    key, pem = _agent_keys(data_dir)
    config = GatewayConfig(
        port=port,
        data_dir=data_dir,
        insecure_dev_tubes=True,
        # The page at / (same origin, so no CORS needed for it; localhost is the same
        # broker under another name, which the browser counts as another origin).
        demo_page=True,
        # (With --port 0 the port is known only once bound: the page is then served to
        # its own origin alone.)
        cors_origins=f"http://localhost:{port} http://127.0.0.1:{port}" if port else None,
        authenticate_command=SIGN_IN,
        agents={
            AGENT: {
                "public_key": pem.name,
                # Explicitly: only agents allowed to serve the Authenticate-Command see it.
                "serves": ["echo", "clock", "whoami", re.escape(SIGN_IN)],
            }
        },
        agents_base_dir=data_dir,
        log_format="text",
        log_level="warning",
    )
    configure_logging(config.log_format, config.log_level)
    # On the broker's default loop (uvloop where installed), as `asbp broker` runs.
    return run_on_loop(lambda: _run(config, key), config.loop)
