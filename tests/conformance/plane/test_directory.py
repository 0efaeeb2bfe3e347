"""The routing plane's directory and forwarding, the same on every implementation."""

from __future__ import annotations

import time

import anyio
import pytest

from gateway.plane.base import Envelope, EnvelopeKind
from tests.support import T
from tests.support.planes import Bus

pytestmark = pytest.mark.anyio

CHANNEL = "0123456789abcdef0123456789abcdef"


async def test_a_channel_is_found_at_its_broker_until_it_closes(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    a.plane.channel_opened(CHANNEL)
    # Announcements are batched, but a plane's calls reach the directory in the order
    # made: once A's own lookup answers, its announcement is there for every broker.
    assert await a.plane.locate_channel(CHANNEL) == "broker-a"
    assert await b.plane.locate_channel(CHANNEL) == "broker-a"
    a.plane.channel_closed(CHANNEL)
    assert await a.plane.locate_channel(CHANNEL) is None
    assert await b.plane.locate_channel(CHANNEL) is None
    assert await b.plane.locate_channel("f" * 32) is None


async def test_the_bus_channels_are_paged_by_identifier_from_a_cursor(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    held = {f"{n:032x}": broker for n, broker in enumerate(("broker-a", "broker-b") * 5)}
    planes = {"broker-a": a.plane, "broker-b": b.plane}
    for channel_id, broker_id in held.items():
        planes[broker_id].channel_opened(channel_id)
    for plane in planes.values():
        await plane.written()
    ids = sorted(held)

    # Three at a time, each page after the last one's final identifier.
    pages: list[tuple[tuple[str, str], ...]] = []
    after = ""
    while True:
        listing = await c.plane.channel_page(after, 0, 3)
        assert listing.total == 10
        if not listing.channels:
            break
        pages.append(listing.channels)
        after = listing.channels[-1][0]
    assert [len(page) for page in pages] == [3, 3, 3, 1]
    assert [entry for page in pages for entry in page] == [(i, held[i]) for i in ids]
    # An offset skips from the cursor; a cursor need not be an open Channel's.
    assert (await a.plane.channel_page(ids[2], 4, 2)).channels == tuple(
        (i, held[i]) for i in ids[7:9]
    )
    assert [i for i, _ in (await a.plane.channel_page(ids[2] + "!", 0, 2)).channels] == ids[3:5]
    assert (await a.plane.channel_page(ids[-1], 0, 5)).channels == ()

    # A closed Channel leaves the page; a dead broker's drop out before any sweep.
    a.plane.channel_closed(ids[0])
    await a.plane.written()
    # A peer of C's (C sent to it), so that C reports it lost once its lease is gone.
    assert await c.plane.send_to("broker-b", Envelope(EnvelopeKind.TUBE, "broker-c", "t", b""))
    await b.abandon()
    with anyio.fail_after(bus_lease(c) + 5 * T):
        assert await c.lost.get() == "broker-b"
    listing = await c.plane.channel_page("", 0, 100)
    assert listing.total == 4
    assert listing.channels == tuple((i, "broker-a") for i in ids[1:] if held[i] == "broker-a")


async def test_respondents_are_the_brokers_serving_a_name(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    b.plane.serving("echo")
    c.plane.serving("echo")
    await b.plane.respondents("echo")  # after the announcements' pipeline
    assert await a.plane.respondents("echo") == {"broker-b", "broker-c"}
    c.plane.not_serving("echo")
    await c.plane.respondents("echo")
    assert await a.plane.respondents("echo") == {"broker-b"}
    assert await a.plane.respondents("nobody") == frozenset()


async def test_a_request_reaches_a_broker_serving_it_intact(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    await b.plane.respondents("echo")
    frame = b"c=echo,u=7,s=x1,i=" + CHANNEL.encode() + b",b=broker-a;hi\x00\xff"
    sent = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, frame, ("agent-1", "agent-2"))
    assert await a.plane.forward_request("echo", sent) == "broker-b"
    with anyio.fail_after(5 * T):
        received = await b.inbound.get()
    assert received == sent


async def test_a_request_never_goes_back_to_its_own_broker(bus: Bus) -> None:
    a = await bus.join("broker-a")
    a.plane.serving("echo")
    await a.plane.respondents("echo")
    envelope = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    assert await a.plane.forward_request("echo", envelope) is None
    assert await a.plane.forward_request("nobody", envelope) is None


async def test_requests_take_turns_among_the_brokers_serving(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    b.plane.serving("echo")
    c.plane.serving("echo")
    await c.plane.respondents("echo")
    envelope = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    targets = [await a.plane.forward_request("echo", envelope) for _ in range(4)]
    assert sorted(t or "" for t in targets) == ["broker-b", "broker-b", "broker-c", "broker-c"]


async def test_frames_reach_the_broker_holding_a_channel(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    envelope = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=echo.reply,u=7,a=x;hi")
    assert await b.plane.forward_to_channel(CHANNEL, envelope) == "broker-a"
    assert await b.plane.send_to("broker-a", envelope)
    with anyio.fail_after(5 * T):
        assert await a.inbound.get() == envelope
        assert await a.inbound.get() == envelope
    assert await b.plane.forward_to_channel("e" * 32, envelope) is None


async def test_a_broker_that_stops_renewing_vanishes_within_its_lease(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    b.plane.channel_opened(CHANNEL)
    await b.plane.respondents("echo")
    envelope = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    assert await a.plane.forward_request("echo", envelope) == "broker-b"  # now a peer of A
    await b.abandon()
    died = time.monotonic()
    with anyio.fail_after(bus_lease(a) + 5 * T):
        assert await a.lost.get() == "broker-b"
    assert time.monotonic() - died <= bus_lease(a) + T
    assert await a.plane.locate_channel(CHANNEL) is None
    assert await a.plane.respondents("echo") == frozenset()
    assert await a.plane.forward_request("echo", envelope) is None
    assert await a.plane.forward_to_channel(CHANNEL, envelope) is None
    assert not await a.plane.send_to("broker-b", envelope)


async def test_a_broker_that_leaves_takes_its_entries_along(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    b.plane.channel_opened(CHANNEL)
    await b.plane.respondents("echo")
    await b.plane.close()
    assert await a.plane.locate_channel(CHANNEL) is None
    assert await a.plane.respondents("echo") == frozenset()


def bus_lease(broker: object) -> float:
    lease: float = broker.plane.lease  # type: ignore[attr-defined]
    return lease


async def test_once_written_every_broker_finds_the_announcements(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    for n in range(20):
        b.plane.serving(f"name-{n}")
        b.plane.channel_opened(f"{n:032x}")
        # No lookup of B's own in between: only ``written`` orders the writes.
        await b.plane.written()
        assert await a.plane.respondents(f"name-{n}") == {"broker-b"}
        assert await a.plane.locate_channel(f"{n:032x}") == "broker-b"


async def test_a_group_reaches_each_broker_holding_members_once(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    b.plane.group_joined("room")
    b.plane.group_joined("hall")
    c.plane.group_joined("room")
    await b.plane.written()
    await c.plane.written()
    assert await a.plane.group_brokers("room") == {"broker-b", "broker-c"}
    sent = Envelope(EnvelopeKind.GROUP, "broker-a", CHANNEL, b"c=news;x", ("room", "hall"))
    assert sorted(await a.plane.forward_to_groups(sent)) == ["broker-b", "broker-c"]
    with anyio.fail_after(5 * T):
        assert await b.inbound.get() == sent
        assert await c.inbound.get() == sent
    assert b.inbound.empty()  # once, though it holds members of both groups
    # Never back to the sender, and a group nobody holds reaches nobody.
    a.plane.group_joined("room")
    await a.plane.written()
    assert sorted(await a.plane.forward_to_groups(sent)) == ["broker-b", "broker-c"]
    lonely = Envelope(EnvelopeKind.GROUP, "broker-a", "", b"c=news;x", ("nobody",))
    assert await a.plane.forward_to_groups(lonely) == ()
    c.plane.group_left("room")
    await c.plane.written()
    assert await a.plane.group_brokers("room") == {"broker-a", "broker-b"}


async def test_a_join_forwarded_writes_the_group_entry_of_the_channels_broker(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    a.plane.channel_opened(CHANNEL)
    await a.plane.written()
    join = Envelope(EnvelopeKind.JOIN, "broker-b", CHANNEL, b"", ("room", "a,b"))
    assert await b.plane.forward_to_channel(CHANNEL, join) == "broker-a"
    # Before broker A has read the join, the groups already lead to it.
    assert await b.plane.group_brokers("room") == {"broker-a"}
    assert await b.plane.group_brokers("a,b") == {"broker-a"}
    with anyio.fail_after(5 * T):
        assert await a.inbound.get() == join
    await a.abandon()
    with anyio.fail_after(bus_lease(b) + 5 * T):
        assert await b.lost.get() == "broker-a"
    assert await b.plane.group_brokers("room") == frozenset()


async def test_requests_go_to_the_broker_with_the_fewest_in_flight(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    for broker in (b, c):
        broker.plane.serving("echo")
    b.plane.report_load("echo", lambda: 3)
    c.plane.report_load("echo", lambda: 0)
    c.plane.report_load("nothing.served", lambda: 9)  # ignored: C does not serve it
    await b.plane.written()
    await c.plane.written()
    assert await a.plane.respondents("nothing.served") == frozenset()
    envelope = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    # C until it has as many as B: each forward counts at once, before C reports.
    targets = [await a.plane.forward_request("echo", envelope) for _ in range(3)]
    assert targets == ["broker-c"] * 3
    # Level now: they take turns.
    more = [await a.plane.forward_request("echo", envelope) for _ in range(4)]
    assert sorted(t or "" for t in more) == ["broker-b", "broker-b", "broker-c", "broker-c"]
    # A report replaces the count: B is idle again.
    b.plane.report_load("echo", lambda: 0)
    await b.plane.written()
    assert await a.plane.forward_request("echo", envelope) == "broker-b"


async def test_an_answered_request_lowers_its_brokers_count_at_once(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    for broker in (b, c):
        broker.plane.serving("echo")
    await b.plane.written()
    await c.plane.written()
    envelope = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    first = await a.plane.forward_request("echo", envelope)
    second = await a.plane.forward_request("echo", envelope)
    assert {first, second} == {"broker-b", "broker-c"}
    assert first is not None
    # The first one answered: its broker is the less loaded until reports say more.
    a.plane.request_done("echo", first)
    await a.plane.written()
    assert await a.plane.forward_request("echo", envelope) == first
    # Done for a broker that no longer serves the name brings nothing back.
    b.plane.not_serving("echo")
    await b.plane.written()
    a.plane.request_done("echo", "broker-b")
    await a.plane.written()
    assert await a.plane.respondents("echo") == {"broker-c"}


async def test_send_to_carries_every_field_and_forward_to_servers_reaches_each(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    b.plane.serving("auth.login")
    c.plane.serving("auth.login")
    a.plane.serving("auth.login")
    await b.plane.written()
    await c.plane.written()
    await a.plane.written()
    report = Envelope(EnvelopeKind.SUBJECT_ASKED, "broker-b", "s1", b"", ("tube-1", "a,b c"))
    assert await b.plane.send_to("broker-a", report)
    with anyio.fail_after(5 * T):
        assert await a.inbound.get() == report
    ask = Envelope(EnvelopeKind.SUBJECT_ASK, "broker-a", "s1", b"c=auth.login;x")
    assert sorted(await a.plane.forward_to_servers("auth.login", ask)) == [
        "broker-b",
        "broker-c",
    ]
    with anyio.fail_after(5 * T):
        assert await b.inbound.get() == ask
        assert await c.inbound.get() == ask
    assert await a.plane.forward_to_servers("nobody", ask) == ()
