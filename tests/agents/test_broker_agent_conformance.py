"""Bad input gets the same answer from a Broker-Agent as from the broker: code, message, u, cause.

Each frame goes to a real broker (``gateway``, on Hypercorn) and to a real
Broker-Agent over a plain WebSocket, and the two answers must be equal, header
and body. Only what both do is compared: the codec's refusals, routing faults
that need no Respondent, and ``asbp.ping``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect

import asbp
from agents import BrokerAgent
from asbp import Command
from tests.support import T
from tests.support.agents import running_broker

pytestmark = pytest.mark.anyio

FRAMES = [
    pytest.param(b"c=asbp.ping,u=1;body", id="ping"),
    pytest.param(b"u=2;", id="no c"),
    pytest.param(b"c=nobody,u=3;", id="no Respondent"),
    pytest.param(b"c=asbp.register,names=x,u=4;", id="an agent's built-in"),
    pytest.param(b"c=asbp.tube,u=5;", id="the Tube greeting"),
    pytest.param(b"c=x,u=6,s=0123456789abcdef0123456789abcdef;", id="a foreign s"),
    pytest.param(b"u=7,c=x'y;", id="a quote out of place"),
    pytest.param(b"+u=8,c=x\xff;", id="not UTF-8"),
    pytest.param(b"c=x,u=9,u=9;", id="duplicate key"),
    pytest.param(b"c=x,u=99999;", id="u too large"),
    pytest.param(b"c=x,u=10,i=nothex;", id="bad i"),
    pytest.param(b"c=x,u=11," + b"k=v," * 70 + b"z=1;", id="too many keys"),
    pytest.param(b"c=x,u=12,g=[" + b",".join([b"a"] * 1100) + b"];", id="too many items"),
    pytest.param(b"c=x,u=13,k=" + b"v" * 9000 + b";", id="header too large"),
    pytest.param(b"c=x,u=14;" + b"x" * (256 * 1024), id="frame too large"),
    pytest.param(b"no terminator", id="no header end"),
]


async def answer(websocket: ClientConnection, frame: bytes) -> Command:
    await websocket.send(frame)
    async with asyncio.timeout(10 * T):
        message = await websocket.recv()
    return asbp.decode(message.encode() if isinstance(message, str) else message)


@pytest.mark.parametrize("frame", FRAMES)
async def test_same_fault_as_the_broker(tmp_path: Path, frame: bytes) -> None:
    async with (
        running_broker(tmp_path, identities=()) as server,
        BrokerAgent("ba").serving() as broker_agent,
        connect(server.ws_url + "/asbp", max_size=None) as to_broker,
        connect(broker_agent.url(), max_size=None) as to_agent,
    ):
        await to_broker.recv()
        await to_agent.recv()
        from_broker = await answer(to_broker, frame)
        from_agent = await answer(to_agent, frame)
    assert from_agent == from_broker
