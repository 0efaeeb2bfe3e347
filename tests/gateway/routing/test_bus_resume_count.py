"""How a client counts (``/asbp?count=2``) follows its Channel across the bus.

Two brokers on one private redis-server, the SDK's Application-Agent at one of them,
and a plain ``websockets`` User-Agent that opens with ``count=2``, pulls queue
messages (``asbp.poll``), does not count them, and resumes at the other broker and
back. The broker it resumes on learns the count from the Channel's resume record
(gateway.connections.resume_state), so it too leaves queue deliveries out of the
log: otherwise the client's count would fall behind the log's numbers and a frame
it had would come again.
"""

from __future__ import annotations

import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import ApplicationAgent
from asbp import Command
from tests.support import RedisServer, RunningServer
from tests.support.bus import frame, until_in_directory
from tests.support.resume_bus import bus, log_holds, redis_server, resume

pytestmark = pytest.mark.anyio

__all__ = ["bus", "redis_server"]  # fixtures, used by name


async def poll_one(connection: ClientConnection, u: int) -> None:
    """``asbp.poll`` one message: its delivery (not counted), then the acceptance."""
    await connection.send(f"c=asbp.poll,destination=jobs,count=1,wait=5,u={u};")
    delivery = await frame(connection)
    assert (delivery.name, delivery.command_id) == ("asbp.notification", u), delivery
    assert delivery.get("receipt") is not None
    accepted = await frame(connection)
    assert (accepted.command_id, accepted.get("count")) == (u, "1"), accepted


async def test_the_count_is_kept_with_the_channel_and_every_broker_logs_by_it(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    a, b, agent = bus
    publisher = await connect(a.ws_url + "/asbp", compression=None)
    assert (await frame(publisher)).name == "asbp.channel"
    for number in (1, 2):
        await publisher.send(f"c=asbp.publish,destination=jobs,type=QUEUE,u={number};job")
        assert (await frame(publisher)).command_id == number

    connection = await connect(a.ws_url + "/asbp?count=2", compression=None)
    greeting = await frame(connection)
    assert greeting.get("count") == "2"
    channel_id, secret = str(greeting.get("i")), str(greeting.get("secret"))
    await poll_one(connection, 1)  # counted: the acceptance (1)
    await agent.send(Command({"c": "news", "d": channel_id, "u": 7}, b"before"))
    assert (await frame(connection)).body == b"before"  # 2
    await connection.close()
    await until_in_directory(redis_server.url, "ch", channel_id, present=False)
    await agent.send(Command({"c": "news", "d": channel_id, "u": 8}, b"away"))
    await log_holds(redis_server.url, channel_id, 3)

    # At the other broker, which never saw the Channel open: it says count=2 back,
    # from the record, whatever this URL says.
    resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, 2)
    assert (answer.name, answer.get("received"), answer.get("count")) == (
        "asbp.resumed",
        "2",
        "2",
    )
    assert (await frame(resumed)).body == b"away"  # 3
    await poll_one(resumed, 2)  # a delivery from broker-b, then the acceptance (4)
    await agent.send(Command({"c": "news", "d": channel_id, "u": 9}, b"later"))
    assert (await frame(resumed)).body == b"later"  # 5
    await resumed.close()
    await until_in_directory(redis_server.url, "ch", channel_id, present=False)

    # Back at the first broker: nothing after 5 was logged, so nothing comes again
    # (had broker-b logged its delivery, "later" would be frame 6, and replayed).
    again, answer = await resume(a.ws_url + "/asbp", channel_id, secret, 5)
    assert (answer.name, answer.get("received"), answer.get("count")) == (
        "asbp.resumed",
        "5",
        "2",
    )
    await again.send("c=asbp.ping,u=3;")
    assert (await frame(again)).command_id == 3
    for each in (again, publisher):
        await each.close()


async def test_a_client_that_says_nothing_resumes_elsewhere_counting_every_frame(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    """The same at the broker it resumes on for a client from before ``count``: the
    delivery is logged and counted, and the frame routed while away still arrives."""
    a, b, agent = bus
    publisher = await connect(a.ws_url + "/asbp", compression=None)
    assert (await frame(publisher)).name == "asbp.channel"
    await publisher.send("c=asbp.publish,destination=jobs,type=QUEUE,u=1;job")
    assert (await frame(publisher)).command_id == 1
    connection = await connect(a.ws_url + "/asbp", compression=None)
    greeting = await frame(connection)
    assert greeting.get("count") is None
    channel_id, secret = str(greeting.get("i")), str(greeting.get("secret"))
    await poll_one(connection, 1)  # counted: the delivery (1) and the acceptance (2)
    await connection.close()
    await until_in_directory(redis_server.url, "ch", channel_id, present=False)
    await agent.send(Command({"c": "news", "d": channel_id, "u": 8}, b"away"))
    await log_holds(redis_server.url, channel_id, 3)
    resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, 2)
    assert (answer.name, answer.get("received"), answer.get("count")) == (
        "asbp.resumed",
        "2",
        None,
    )
    assert (await frame(resumed)).body == b"away"
    for each in (resumed, publisher):
        await each.close()
