"""``asbp demo``: a broker and the example Application-Agent, ready to try.

It keeps everything in one folder (``.asbp-demo`` by default): the broker's
identity and a key pair for the example agent ``echo``, made on first run.
The agent connects over a plain-text Tube, which the broker accepts only
because the demo listens on loopback with ``insecure_dev_tubes``: a
development convenience that the broker refuses anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Final

from agents.credentials import generate_agent_key
from gateway.config.model import GatewayConfig

__all__ = ["AGENT", "demo"]

#: The example agent's identity.
AGENT: Final = "echo"
#: Where the example agent lives in a source checkout.
_EXAMPLE: Final = Path(__file__).resolve().parents[1] / "examples" / "echo_agent.py"
_READY_TIMEOUT: Final = 20.0


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
serves `echo` and `clock`. Try it from another terminal:

  # a stateless HTTP Channel: send a Command, then long-poll for the answer
  curl -s -d 'c=echo,u=1;hello' {base}/asbp
  curl -s '{base}/asbp?i=<the i from the first answer>&wait=5'

  # or a WebSocket Channel, with websocat, then type: c=echo,u=1;hello
  websocat {base.replace("http", "ws", 1)}/asbp

Ctrl-C stops both.
"""


async def _start_agent(base: str, key: Path) -> asyncio.subprocess.Process:
    tube = base.replace("http", "ws", 1) + "/tube"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(_EXAMPLE),
        "--url",
        tube,
        "--identity",
        AGENT,
        "--key-file",
        str(key),
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    async with asyncio.timeout(_READY_TIMEOUT):
        while True:
            line = await process.stderr.readline()
            if not line:
                raise RuntimeError("the example agent exited before it was ready")
            if line.startswith(b"serving"):
                break
    return process


async def _run(config: GatewayConfig, key: Path) -> int:
    from gateway.ops.server import serve

    stop = asyncio.Event()
    ready = asyncio.Event()
    base_url: list[str] = []
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def on_ready(url: str) -> None:
        base_url.append(url)
        ready.set()

    server = asyncio.create_task(serve(config, ready=on_ready, shutdown_trigger=stop.wait))
    agent: asyncio.subprocess.Process | None = None
    try:
        done, _ = await asyncio.wait(
            {server, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED
        )
        if server in done:
            server.result()
            return 1
        if _EXAMPLE.exists():
            agent = await _start_agent(base_url[0], key)
            print(_banner(base_url[0]), flush=True)
        else:
            print(f"broker ready at {base_url[0]} (examples/ not found: no agent)", flush=True)
        await stop.wait()
    finally:
        if agent is not None and agent.returncode is None:
            agent.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await agent.wait()
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
        stop.set()
        await server
    return 0


def demo(port: int = 8080, data_dir: Path = Path(".asbp-demo")) -> int:
    """Run the demo until SIGINT or SIGTERM; returns the exit status."""
    from gateway.ops.logs import configure_logging

    key, pem = _agent_keys(data_dir)
    config = GatewayConfig(
        port=port,
        data_dir=data_dir,
        insecure_dev_tubes=True,
        agents={AGENT: {"public_key": pem.name}},
        agents_base_dir=data_dir,
        log_format="text",
        log_level="warning",
    )
    configure_logging(config.log_format, config.log_level)
    return asyncio.run(_run(config, key))
