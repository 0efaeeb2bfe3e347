"""The management API on a live broker: its operations, its authentication, and
schemathesis against its own OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from asbp import Command
from gateway.acl import load_acl
from gateway.api.access import ManagementAccess
from gateway.api.declare import ApiError
from gateway.api.operations import MAX_CHANNEL_OFFSET
from gateway.config.model import GatewayConfig, ManagementConfig, MessagingLimits
from tests.support import T
from tests.support.gateway import BROKER_ID, Gateway, GatewayFactory
from tests.support.messaging import Messenger, user

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-admin-token-for-tests"
POLICY = """
[[security.policies.default.entries]]
action = "DENY"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["WRITE"]
condition = { always = true }
"""


async def api(gateway: Gateway, method: str, path: str, **options: Any) -> httpx.Response:
    client = await gateway.http_client()
    return await client.request(method, f"{gateway.server.http_url}/api/v1{path}", **options)


async def test_the_broker_says_who_it_is_and_that_it_speaks_for_itself(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway()
    await gateway.channel()
    response = await api(gateway, "GET", "/broker")
    assert response.status_code == 200
    body = response.json()
    assert body["scope"] == "broker"
    [broker] = body["brokers"]
    assert (broker["broker"], broker["engine"], broker["channels"]) == (BROKER_ID, "memory", 1)
    assert broker["uptime_seconds"] >= 0


async def test_channels_are_listed_paged_and_closed_with_the_reason_logged(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway()
    channels = [await gateway.channel() for _ in range(3)]
    ids = sorted(channel.id for channel in channels)

    page = (await api(gateway, "GET", "/channels", params={"offset": 1, "limit": 1})).json()
    assert (page["total"], [item["id"] for item in page["items"]]) == (3, [ids[1]])
    one = (await api(gateway, "GET", f"/channels/{ids[0]}")).json()
    assert (one["id"], one["transport"], one["broker"]) == (ids[0], "websocket", BROKER_ID)

    victim = next(channel for channel in channels if channel.id == ids[0])
    closed = await api(gateway, "POST", f"/channels/{ids[0]}/close", json={"reason": "abuse"})
    assert closed.json() == {"id": ids[0], "closed": True, "broker": BROKER_ID}
    await asyncio.wait_for(victim.ws.wait_closed(), 5 * T)
    record = await gateway.events.wait("management.write", action="channel.close")
    assert (record.__dict__["principal"], record.__dict__["reason"]) == ("loopback", "abuse")

    missing = await api(gateway, "GET", f"/channels/{ids[0]}")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["status"] == 404


async def test_the_channels_page_offset_is_capped_and_points_to_the_cursor(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway()
    await gateway.channel()
    document = (await api(gateway, "GET", "/openapi.json")).json()
    [offset] = [
        p
        for p in document["paths"]["/api/v1/channels"]["get"]["parameters"]
        if p["name"] == "offset"
    ]
    assert offset["schema"]["maximum"] == MAX_CHANNEL_OFFSET == 10_000
    assert "after" in offset["description"]

    fine = await api(gateway, "GET", "/channels", params={"offset": MAX_CHANNEL_OFFSET})
    assert (fine.status_code, fine.json()["items"], fine.json()["total"]) == (200, [], 1)
    for beyond in (MAX_CHANNEL_OFFSET + 1, 10**18):
        refused = await api(gateway, "GET", "/channels", params={"offset": beyond})
        assert refused.status_code == 400
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["status"] == 400
        assert problem["detail"] == (
            "offset must be at most 10000; page with after=<next_after of the page before> instead"
        )
    # Other pages keep their own offsets (the queues page sorts a list in memory).
    assert (await api(gateway, "GET", "/queues", params={"offset": 10**6})).status_code == 200


async def test_agents_show_their_tubes_and_what_they_serve(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway()
    await gateway.tube("billing", serves=("quote", "invoice"))
    agents = (await api(gateway, "GET", "/agents")).json()["items"]
    assert [(a["agent"], [t["serves"] for t in a["tubes"]]) for a in agents] == [
        ("billing", [["invoice", "quote"]])
    ]
    assert (await api(gateway, "GET", "/subjects")).json() == {"count": 0, "scope": "broker"}
    assert (await api(gateway, "DELETE", "/subjects/nobody")).status_code == 404


async def test_topic_subscriptions_are_listed(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway()
    first, second = await user(gateway), await user(gateway)
    for client in (first, second):
        await client.ok("asbp.subscribe", destination="news")
    await first.ok("asbp.subscribe", destination="sports/.*")
    body = (await api(gateway, "GET", "/topics")).json()
    here = gateway.broker_id
    assert body == {
        "items": [
            {"name": "news", "pattern": False, "subscribers": 2, "broker": here},
            {"name": "sports/.*", "pattern": True, "subscribers": 1, "broker": here},
        ],
        "scope": "broker",
        "total": 2,
    }


async def test_queues_deepest_first_and_a_purge_empties_one(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway()
    publisher = await user(gateway)
    for name, count in (("a/b", 1), ("deep", 3)):
        for n in range(count):
            await publisher.publish(name, b"%d" % n, type="QUEUE")

    page = (await api(gateway, "GET", "/queues")).json()
    assert [(q["name"], q["depth"]) for q in page["items"]] == [("deep", 3), ("a/b", 1)]
    assert (await api(gateway, "GET", "/queues/a/b")).json()["depth"] == 1

    purged = await api(gateway, "POST", "/queues/deep/purge")
    assert purged.json() == {"queue": "deep", "removed": 3}
    assert (await api(gateway, "GET", "/queues/deep")).json()["depth"] == 0
    assert (await api(gateway, "POST", "/queues/none/purge")).status_code == 404
    await gateway.events.wait("management.write", action="queue.purge", queue="deep")


async def test_a_queue_is_peeked_and_its_dead_letters_moved_back(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(messaging=MessagingLimits(max_deliveries=1))
    publisher = await user(gateway)
    await publisher.publish("jobs", b"poison \xff", type="QUEUE", notice="dequeued")

    peeked = (await api(gateway, "GET", "/queues/jobs/messages", params={"limit": 5})).json()
    # Undecodable bytes replaced; nothing leased by looking.
    assert [(m["payload"], m["deliveries"]) for m in peeked["items"]] == [("poison \ufffd", 0)]
    assert peeked["items"][0]["payload_bytes"] == 8
    info = (await api(gateway, "GET", "/queues/jobs")).json()
    assert (info["depth"], info["dead_letters"]) == (1, 0)
    assert info["oldest_age_seconds"] >= 0

    peer = await gateway.channel()
    consumer = Messenger.of(peer)
    # A poll, not a subscription: no queue consumer outlives the Channel to
    # take the message again once it is moved back.
    polled = await consumer.ok("asbp.poll", destination="jobs", type="QUEUE")
    assert polled.get("count") == "1"
    assert consumer.pending()[0].body == b"poison \xff"
    await peer.close()  # its one delivery used up: a dead letter
    discarded = await publisher.take("asbp.notice")
    assert discarded.get("reason") == "discarded"

    dead = (await api(gateway, "GET", "/queues/jobs/dead-letters")).json()
    assert [(m["payload"], m["deliveries"]) for m in dead["items"]] == [("poison \ufffd", 1)]
    info = (await api(gateway, "GET", "/queues/jobs")).json()
    assert (info["depth"], info["dead_letters"], info["oldest_age_seconds"]) == (0, 1, None)
    listed = (await api(gateway, "GET", "/queues")).json()["items"]
    assert [(q["name"], q["dead_letters"]) for q in listed] == [("jobs", 1)]

    moved = await api(gateway, "POST", "/queues/jobs/dead-letters/requeue", json={})
    assert moved.json() == {"queue": "jobs", "moved": 1}
    await gateway.events.wait("management.write", action="queue.requeue_dead_letters", queue="jobs")
    peeked = (await api(gateway, "GET", "/queues/jobs/messages")).json()
    assert [(m["payload"], m["deliveries"]) for m in peeked["items"]] == [("poison \ufffd", 0)]
    assert (await api(gateway, "GET", "/queues/jobs/dead-letters")).json()["items"] == []
    for path in ("/queues/none/messages", "/queues/none/dead-letters"):
        assert (await api(gateway, "GET", path)).status_code == 404
    refused = await api(gateway, "POST", "/queues/jobs/dead-letters/requeue", json={"count": 0})
    assert refused.status_code == 400


async def test_the_acl_is_asked_for_an_identity(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(acl=load_acl(POLICY))
    ask = {"identity": "billing", "action": "WRITE", "destination": "admin.reset"}
    decision = (await api(gateway, "POST", "/acl/check", json=ask)).json()
    assert decision == {"enabled": True, "allowed": False, "policy": "default", "entry_index": 0}
    ask["destination"] = "quote"
    assert (await api(gateway, "POST", "/acl/check", json=ask)).json()["allowed"] is True
    bad = await api(gateway, "POST", "/acl/check", json={"identity": "x", "action": "EAT"})
    assert bad.status_code == 400


async def test_the_acl_is_reloaded_from_its_file_and_a_bad_file_is_refused_with_its_line(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    policy_file = tmp_path / "broker.toml"
    policy_file.write_text(POLICY + '\n[security.agents]\nbilling = "strict"\n'
                           '[security.policies.strict]\ninherits = "default"\n')  # fmt: skip
    gateway = await make_gateway(acl=load_acl(policy_file))
    policy = await api(gateway, "GET", "/acl/policy", params={"identity": "billing"})
    assert policy.json() == {
        "enabled": True,
        "identity": "billing",
        "policy": "strict",
        "source": str(policy_file),
    }
    channel = await gateway.channel()
    assert (await channel.request(Command(c="quote", u=1))).get("code") == "2101"

    # Deny quote too, and reload: the running broker now refuses it.
    policy_file.write_text(POLICY.replace("admin\\..*", "(admin\\..*|quote)"))
    reloaded = await api(gateway, "POST", "/acl/reload")
    assert reloaded.json() == {"source": str(policy_file), "policies": ["default"]}
    assert (await channel.request(Command(c="quote", u=2))).get("code") == "3201"
    await gateway.events.wait("management.write", action="acl.reload", principal="loopback")

    # A bad file: 422 naming the file and line; the lists in force stay.
    policy_file.write_text("[security]\n[[security.policies.default.entries]]\naction = 1\n")
    refused = await api(gateway, "POST", "/acl/reload")
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(f"{policy_file}:2: ")
    assert (await channel.request(Command(c="quote", u=3))).get("code") == "3201"


async def test_without_a_file_there_is_nothing_to_reload(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway()
    assert (await api(gateway, "POST", "/acl/reload")).status_code == 409
    policy = await api(gateway, "GET", "/acl/policy", params={"identity": "x"})
    assert policy.json()["enabled"] is False
    assert (await api(gateway, "GET", "/acl/policy")).status_code == 400


async def test_the_config_is_shown_with_secrets_masked(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(redis_url="redis://user:hunter2@127.0.0.1:6379/0")
    config = (await api(gateway, "GET", "/config")).json()["config"]
    assert config["broker_id"] == BROKER_ID
    assert "hunter2" not in json.dumps(config)


# -- authentication ---------------------------------------------------------------


async def test_a_static_token_is_required_once_configured(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    gateway = await make_gateway(management=ManagementConfig(token_file=str(token_file)))
    anonymous = await api(gateway, "GET", "/broker")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="asbp"'
    wrong = await api(gateway, "GET", "/broker", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    good = await api(gateway, "GET", "/broker", headers={"Authorization": f"Bearer {TOKEN}"})
    assert good.status_code == 200


def _issuer(tmp_path: Path) -> tuple[KeySet, Path]:
    keys = KeySet([RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)])
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(keys.as_dict(private=False)))
    return keys, jwks


def _token(keys: KeySet, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": "https://idp.test", "aud": "asbp", "sub": "alice", "exp": now + 60}
    payload.update(claims)
    return jwt.encode({"alg": "RS256", "kid": "k1"}, payload, keys)


async def test_jwt_access_tokens_need_the_issuer_audience_and_scope(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    keys, jwks = _issuer(tmp_path)
    management = ManagementConfig(jwks_file=str(jwks), issuer="https://idp.test", audience="asbp")
    gateway = await make_gateway(management=management)
    await gateway.channel()

    def bearer(**claims: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {_token(keys, **claims)}"}

    reader = bearer(scope="asbp:read")
    assert (await api(gateway, "GET", "/channels", headers=reader)).status_code == 200
    denied = await api(gateway, "POST", "/queues/x/purge", headers=reader)
    assert (denied.status_code, denied.json()["detail"]) == (
        403,
        "the token lacks the scope asbp:write",
    )
    # RFC 6750's challenges, from authlib's resource server.
    assert denied.headers["www-authenticate"] == (
        'Bearer realm="asbp", error="insufficient_scope", scope="asbp:write"'
    )
    expired = await api(gateway, "GET", "/broker", headers=bearer(scope="asbp:read", exp=1))
    assert expired.status_code == 401
    assert expired.headers["www-authenticate"].startswith(
        'Bearer realm="asbp", error="invalid_token", error_description="the bearer token is not'
    )
    writer = bearer(scp=["asbp:read", "asbp:write"])
    assert (await api(gateway, "POST", "/queues/x/purge", headers=writer)).status_code == 404
    for claims in ({"iss": "https://evil.test"}, {"aud": "other"}, {"exp": 1}):
        refused = await api(gateway, "GET", "/broker", headers=bearer(scope="asbp:read", **claims))
        assert refused.status_code == 401, claims
    forged_keys, _ = _issuer(tmp_path / "..")
    forged = {"Authorization": f"Bearer {_token(forged_keys, scope='asbp:read')}"}
    assert (await api(gateway, "GET", "/broker", headers=forged)).status_code == 401


async def test_beyond_loopback_nothing_configured_means_locked() -> None:
    access = ManagementAccess(GatewayConfig(host="0.0.0.0"))
    assert not access.open
    with pytest.raises(ApiError) as refused:
        await access.principal(None, "127.0.0.1", "read")
    assert refused.value.status == 401
    on_loopback = ManagementAccess(GatewayConfig(host="127.0.0.1"))
    assert await on_loopback.principal(None, "127.0.0.1", "read") == "loopback"
    with pytest.raises(ApiError):
        await on_loopback.principal(None, "192.0.2.1", "read")


# -- schemathesis ------------------------------------------------------------------


async def test_schemathesis_finds_no_5xx_and_no_response_off_its_schema(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN)
    gateway = await make_gateway(management=ManagementConfig(token_file=str(token_file)))
    # Something to list, close and purge.
    await gateway.tube("billing", serves=("quote",))
    publisher = await user(gateway)
    await publisher.publish("jobs", b"work", type="QUEUE")
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{gateway.server.http_url}/api/v1/openapi.json",
        "--checks",
        "not_a_server_error,response_schema_conformance,status_code_conformance,"
        "content_type_conformance",
        "--max-examples",
        "25",
        "--seed",
        "15",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120 * T)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text
    assert "passed" in text and "failed" not in text.split("SUMMARY")[-1], text
