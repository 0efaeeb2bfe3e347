"""Publish the analytics summary on the bus, once, as an Application-Agent.

The job publishes over a Tube, as its own agent identity, rather than over a
User-Agent Channel: a Tube is authenticated (the broker verifies the key
before the greeting), so the broker's ACLs can give exactly that identity
the right to write ``/system/stats/analytics`` (docs/acl.md, "Writing under
/system/"), and every subscriber's notification carries the verified
``a=<identity>``, so readers know the figures came from the job and not from
some client. A Channel is anonymous unless its User-Agent authenticates a
Subject, and a Subject's roles are a coarser thing to grant a system topic to.

One connection, one ``asbp.publish`` with ``u``, wait for ``asbp.accepted``
(the broker has taken the message), close. A refused handshake is not retried
for ever: the whole publication has ``timeout`` seconds.

Needs no pyspark: the CLI calls it after the Spark session has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from typing import Any, Final

import orjson

from agents.backoff import Backoff
from agents.credentials import AgentCredentialSource
from agents.spark.errors import SparkError
from agents.tube import TubeLink, TubeSession
from asbp import Command
from asbp.names import PUBLISH

__all__ = ["PUBLISH", "SUMMARY_TOPIC", "PublishError", "publish_summary"]

#: Where the summary goes (a system topic: see docs/acl.md for who may write it).
SUMMARY_TOPIC: Final = "/system/stats/analytics"


class PublishError(SparkError):
    """The summary could not be published: no Tube within the timeout."""


async def publish_summary(
    summary: dict[str, Any] | bytes,
    *,
    url: str,
    credentials: AgentCredentialSource,
    topic: str = SUMMARY_TOPIC,
    ssl: ssl_module.SSLContext | None = None,
    timeout: float = 10.0,
    logger: logging.Logger | None = None,
) -> str | None:
    """Publish ``summary`` (JSON) to ``topic`` through the broker at ``url``.

    Args:
        summary: the summary, or its JSON already encoded.
        url: the broker's Tube endpoint (``wss://host/tube``).
        credentials: the job's agent identity and key.
        topic: the topic.
        ssl: TLS context for ``wss://``; None uses the system's defaults.
        timeout: seconds for the whole publication.
        logger: where the Tube logs (refusals at ERROR).

    Returns:
        The message ``id`` the broker gave the publication.

    Raises:
        PublishError: no Tube opened within ``timeout`` (refused: see the log).
        FaultError: the broker refused the publication (3201: the ACL).
        ConnectionLost, TimeoutError: the Tube closed, or no answer in time.
    """
    body = summary if isinstance(summary, bytes) else orjson.dumps(summary)
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[TubeSession] = loop.create_future()
    log = logger or logging.getLogger("asbp.analytics")

    async def on_open(session: TubeSession) -> None:
        if not opened.done():
            opened.set_result(session)

    def on_command(session: TubeSession, command: Command) -> None:
        log.debug("analytics: ignored %s from broker %s", command.name, session.broker_id)

    link = TubeLink(
        url,
        credentials,
        ssl=ssl,
        backoff=Backoff(initial=0.2, maximum=2.0),
        timeout=timeout,
        logger=log,
        on_open=on_open,
        on_command=on_command,
    )
    command = Command(
        {"c": PUBLISH, "destination": topic, "type": "TOPIC", "m": "application/json"}, body
    )
    link.start()
    session: TubeSession | None = None
    try:
        async with asyncio.timeout(timeout):
            session = await asyncio.shield(opened)
            accepted = await session.call(command, timeout=None)
    except TimeoutError as exc:
        if session is None:
            raise PublishError(f"no Tube to {url} within {timeout} s (the log says why)") from exc
        raise
    finally:
        await link.stop()
    message_id = accepted.get("id")
    return message_id if isinstance(message_id, str) else None
