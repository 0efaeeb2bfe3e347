"""``/metrics`` on a live broker: what a scrape says after real traffic."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from asbp import Command
from gateway.config.model import MetricsConfig
from gateway.metrics.catalogue import METRICS
from gateway.metrics.counts import LATENCY_SAMPLE
from tests.support.gateway import BROKER_ID, Gateway, GatewayFactory
from tests.support.messaging import user

pytestmark = pytest.mark.anyio


async def scrape(gateway: Gateway) -> dict[str, list[Sample]]:
    client = await gateway.http_client()
    response = await client.get(f"{gateway.server.http_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        family.name: list(family.samples)
        for family in text_string_to_metric_families(response.text)
    }


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float:
    family = sample
    for suffix in ("_total", "_count", "_sum", "_bucket"):
        family = family.removesuffix(suffix)
    for candidate in families[family]:
        if candidate.name == sample and candidate.labels == labels:
            return candidate.value
    raise AssertionError(f"no {sample}{labels} in {families[family]}")


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
async def test_a_scrape_names_every_catalogued_family_and_nothing_else(
    gateway: Gateway,
) -> None:
    families = await scrape(gateway)
    assert set(families) == {metric.name for metric in METRICS}


async def test_routed_commands_faults_and_connections_are_counted(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway()
    agent = await gateway.tube("billing", serves=("quote",))
    channel = await gateway.channel()
    # Nine answers: the first and the ninth are timed (LATENCY_SAMPLE 8), the
    # ninth counting for the eight since the first, so the histogram counts nine.
    for u in range(1 + LATENCY_SAMPLE):
        await channel.send(Command(c="quote", u=u))
        request = await agent.recv()
        await agent.send(Command(c="quote.reply", d=str(request.get("i")), u=u))
        assert (await channel.recv()).name == "quote.reply"
    fault = await channel.request(Command(c="nobody.serves", u=9))
    assert fault.get("code") == "2101"

    families = await scrape(gateway)
    assert value(families, "asbp_commands_total", origin="channel", command="quote") == 9
    assert value(families, "asbp_commands_total", origin="channel", command="nobody.serves") == 1
    assert value(families, "asbp_commands_total", origin="agent", command="quote.reply") == 9
    assert value(families, "asbp_faults_total", code="2101") == 1
    assert value(families, "asbp_channels", transport="websocket") == 1
    assert value(families, "asbp_tubes", agent="billing") == 1
    assert value(families, "asbp_channels_opened_total") == 1
    assert value(families, "asbp_tubes_opened_total") == 1
    assert value(families, "asbp_commands_in_flight") == 0
    assert value(families, "asbp_respondent_latency_seconds_count", command="quote") == 9
    [info] = families["asbp_broker_info"]
    assert (info.labels["broker"], info.labels["engine"], info.value) == (BROKER_ID, "memory", 1)


async def test_command_names_past_the_limit_count_as_other(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(metrics=MetricsConfig(command_names=2))
    channel = await gateway.channel()
    for n in range(5):
        reply = await channel.request(Command(c=f"name{n}", u=n))
        assert reply.get("code") == "2101"
    families = await scrape(gateway)
    commands = {s.labels["command"]: s.value for s in families["asbp_commands"]}
    assert commands == {"name0": 1, "name1": 1, "other": 3}


async def test_queue_traffic_and_the_deepest_queues(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(metrics=MetricsConfig(top_queues=2))
    publisher, consumer = await user(gateway), await user(gateway)
    for name, count in (("shallow", 1), ("middle", 2), ("deep", 3)):
        for n in range(count):
            await publisher.publish(name, b"%d" % n, type="QUEUE")
    reply = await consumer.call("asbp.poll", destination="deep")
    assert reply.get("count") == "1"
    note = await consumer.notification()
    await consumer.ok("asbp.ack", destination=note.get("subscription"), receipt=note.get("receipt"))

    families = await scrape(gateway)
    depths = {s.labels["queue"]: s.value for s in families["asbp_queue_depth"]}
    assert depths == {"middle": 2, "deep": 2}
    assert value(families, "asbp_queue_depth_all") == 5
    assert value(families, "asbp_queues") == 3
    assert value(families, "asbp_queue_publications_total") == 6
    assert value(families, "asbp_queue_deliveries_total") == 1
    assert value(families, "asbp_queue_acks_total") == 1
    assert value(families, "asbp_poll_wait_seconds_count") == 1
    # The publications, the poll excepted, and the acknowledgement were engine calls.
    assert value(families, "asbp_engine_call_seconds_count") >= 7


async def test_metrics_off_serves_no_route_and_counts_no_names(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(metrics=MetricsConfig(enabled=False))
    client = await gateway.http_client()
    response = await client.get(f"{gateway.server.http_url}/metrics")
    assert response.status_code == 404
    assert await gateway.call(lambda broker: broker.router.counts) is None
