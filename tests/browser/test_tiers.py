"""The TypeScript client (the code a browser runs) against a Broker-Agent: three tiers.

``examples/broker_agent.py`` runs as a process; Node runs the built client
(agents/js) against it over WebSocket, the only transport a Broker-Agent has:
an echo, and the Respondent's own fault with its code and message.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.support import T
from tests.support.js import built_client, node
from tests.support.tiers import example, running_process

pytestmark = pytest.mark.anyio

SCRIPT = """
import { Client, FaultError } from "./dist/index.js";
const client = new Client(process.env.ASBP_URL, { transports: ["websocket"] });
await client.connect();
const result = { echo: new TextDecoder().decode((await client.request("echo", "from node")).body) };
try {
  await client.request("notes.get", "absent");
} catch (error) {
  result.fault = { isFault: error instanceof FaultError, code: error.code, message: error.message };
}
client.close();
console.log(JSON.stringify(result));
"""


async def test_the_typescript_client_talks_to_a_broker_agent() -> None:
    folder = built_client()
    async with running_process([*example("broker_agent"), "--port", "0"], "ba") as ba:
        line = await ba.wait_line(lambda line: line.startswith("listening "))
        env = {**os.environ, "ASBP_URL": line.split()[1]}
        # Node 20 has a global WebSocket only behind this flag (Node 22 by default).
        script = await asyncio.create_subprocess_exec(
            node(),
            "--experimental-websocket",
            "--input-type=module",
            "-e",
            SCRIPT,
            cwd=folder,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60 * T):
            stdout, stderr = await script.communicate()
        assert script.returncode == 0, stderr.decode()
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    assert result["echo"] == "from node"
    assert result["fault"]["isFault"] is True
    assert result["fault"]["code"] == 2101
    assert "no such note" in result["fault"]["message"]
