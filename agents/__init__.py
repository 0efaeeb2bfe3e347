"""The ASBP agent SDK: Application-Agents that serve Respondents, and a User-Agent client.

::

    agent = ApplicationAgent("echo", credentials, ["wss://broker-a/tube", "wss://broker-b/tube"])

    @agent.respondent("echo")
    async def echo(request: Request) -> bytes:
        return request.body

    await agent.run()  # until cancelled (Ctrl-C) or agent.close(); then a graceful shutdown

    async with UserAgent.websocket("wss://broker-a/asbp") as ua:
        reply = await ua.request("echo", b"hi")

    broker = BrokerAgent("shop")              # three tiers: User-Agents connect here
    broker.add_respondent("echo", echo)       # the same handlers, in process
    downstream = Downstream("wss://inner/asbp")
    broker.add_respondent("stock", forward_to(downstream))   # and on to another bus

Modules, one concept each: ``agent`` (the Application-Agent), ``respondent``
(handlers, the Request they get, the table of them), ``dispatch`` (running
handlers), ``tube`` (one reconnecting Tube), ``addressing`` (which broker a
Channel is at), ``user_agent`` (the User-Agent), ``channel`` (its WebSocket
and HTTP transports), ``multipart`` (the long-poll response reader),
``streams`` (reassembling a reply sent in ``t``/``o`` parts),
``broker_agent`` and ``broker_channel`` (the Broker-Agent, draft §2.5),
``intermediary`` (Intermediary-Agents, §3.4: ``Downstream``, ``forward_to``,
``IntermediaryAgent``), ``backoff``,
``reconnect`` (a User-Agent's reconnection settings and events),
``control`` (the broker's built-in names), ``credentials``, ``errors`` (the
exception tree). ``agents.spark`` (Spark jobs on the bus) needs the ``spark``
extra and is never imported from here.
"""

from __future__ import annotations

from agents.agent import AgentState, ApplicationAgent, TubeStatus
from agents.backoff import Backoff
from agents.broker_agent import BrokerAgent
from agents.credentials import AgentCredentialSource, generate_agent_key
from agents.discovery import BrokerDiscovery, HostsFileResolver
from agents.dispatch import HANDLER_FAILED
from agents.errors import (
    AgentError,
    BrokerBusy,
    ChannelLost,
    ConnectionLost,
    FaultError,
    NotConnected,
)
from agents.intermediary import Downstream, IntermediaryAgent, forward_to
from agents.reconnect import ChannelEvent, ChannelEventKind, Reconnect
from agents.respondent import Handler, Reply, Request
from agents.user_agent import UserAgent

__all__ = [
    "HANDLER_FAILED",
    "AgentCredentialSource",
    "AgentError",
    "AgentState",
    "ApplicationAgent",
    "Backoff",
    "BrokerAgent",
    "BrokerBusy",
    "BrokerDiscovery",
    "ChannelEvent",
    "ChannelEventKind",
    "ChannelLost",
    "ConnectionLost",
    "Downstream",
    "FaultError",
    "Handler",
    "HostsFileResolver",
    "IntermediaryAgent",
    "NotConnected",
    "Reconnect",
    "Reply",
    "Request",
    "TubeStatus",
    "UserAgent",
    "forward_to",
    "generate_agent_key",
]
