"""Handshake throttling: gateway.auth.throttle on a fake clock, then on a real broker."""

from __future__ import annotations

import logging

import pytest
from websockets.exceptions import InvalidStatus

from gateway.auth.throttle import WINDOW, HandshakeThrottle, address_key
from tests.support.gateway import SERVERS, Gateway, GatewayFactory, assert_fault, decode


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fail(throttle: HandshakeThrottle, address: str, times: int) -> None:
    for _ in range(times):
        assert throttle.allow(address)
        throttle.failed(address)


# --------------------------------------------------------------------------
# The budget


def test_an_address_without_failures_is_allowed_and_not_remembered(clock: Clock) -> None:
    throttle = HandshakeThrottle(3, clock=clock)
    assert throttle.allow("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == 0
    assert throttle.refusals("192.0.2.1") == 0
    assert len(throttle) == 0


def test_the_budget_is_a_burst_then_one_per_refill_interval(clock: Clock) -> None:
    throttle = HandshakeThrottle(3, clock=clock)
    fail(throttle, "192.0.2.1", 3)

    assert not throttle.allow("192.0.2.1")
    # One token comes back every 60 / 3 = 20 seconds.
    assert throttle.retry_after("192.0.2.1") == pytest.approx(20.0)
    clock.advance(19.5)
    assert not throttle.allow("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == pytest.approx(0.5)
    clock.advance(0.5)
    assert throttle.allow("192.0.2.1")
    throttle.failed("192.0.2.1")
    assert not throttle.allow("192.0.2.1")


def test_a_fully_refilled_address_is_forgotten(clock: Clock) -> None:
    throttle = HandshakeThrottle(3, clock=clock)
    fail(throttle, "192.0.2.1", 3)
    assert len(throttle) == 1
    clock.advance(WINDOW)
    assert throttle.allow("192.0.2.1")
    assert len(throttle) == 0
    fail(throttle, "192.0.2.1", 3)  # a full burst again


def test_failures_past_the_budget_do_not_dig_deeper(clock: Clock) -> None:
    throttle = HandshakeThrottle(2, clock=clock)
    fail(throttle, "192.0.2.1", 2)
    for _ in range(10):  # failed() without asking first: still at most one token owed
        throttle.failed("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == pytest.approx(30.0)


def test_refused_attempts_are_counted_and_cost_nothing(clock: Clock) -> None:
    throttle = HandshakeThrottle(1, clock=clock)
    fail(throttle, "192.0.2.1", 1)
    for count in (1, 2, 3):
        assert not throttle.allow("192.0.2.1")
        assert throttle.refusals("192.0.2.1") == count
    # Refusals did not push the next attempt back.
    clock.advance(WINDOW - 1)
    assert throttle.retry_after("192.0.2.1") == pytest.approx(1.0)
    clock.advance(1)
    assert throttle.allow("192.0.2.1")
    assert throttle.refusals("192.0.2.1") == 0


def test_success_forgets_the_failures(clock: Clock) -> None:
    throttle = HandshakeThrottle(3, clock=clock)
    fail(throttle, "192.0.2.1", 2)
    throttle.succeeded("192.0.2.1")
    assert len(throttle) == 0
    fail(throttle, "192.0.2.1", 3)
    throttle.succeeded("192.0.2.99")  # another address: no effect
    assert not throttle.allow("192.0.2.1")


@pytest.mark.parametrize(
    ("seconds", "header"), [(20.0, 20), (19.01, 20), (0.2, 1), (0.0001, 1), (59.99, 60)]
)
def test_retry_after_header_rounds_up_to_whole_seconds(
    clock: Clock, seconds: float, header: int
) -> None:
    throttle = HandshakeThrottle(1, clock=clock)
    fail(throttle, "192.0.2.1", 1)
    clock.advance(WINDOW - seconds)
    assert throttle.retry_after_header("192.0.2.1") == header


def test_a_clock_going_backwards_refills_nothing(clock: Clock) -> None:
    throttle = HandshakeThrottle(1, clock=clock)
    fail(throttle, "192.0.2.1", 1)
    clock.advance(-30)
    assert not throttle.allow("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == pytest.approx(WINDOW)


@pytest.mark.parametrize(("failures", "addresses"), [(0, 10), (-1, 10), (1, 0)])
def test_limits_below_one_are_refused(failures: int, addresses: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HandshakeThrottle(failures, max_addresses=addresses)


# --------------------------------------------------------------------------
# Which address


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::1", "::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),  # IPv4-mapped: the IPv4 peer it is
        ("/run/asbp.sock", "/run/asbp.sock"),  # not an IP: as it is
        ("", ""),
    ],
)
def test_address_key(address: str, key: str) -> None:
    assert address_key(address) == key


def test_ipv4_is_throttled_per_address(clock: Clock) -> None:
    throttle = HandshakeThrottle(2, clock=clock)
    fail(throttle, "198.51.100.1", 2)
    assert not throttle.allow("198.51.100.1")
    assert throttle.allow("198.51.100.2")


def test_ipv6_is_throttled_per_64(clock: Clock) -> None:
    throttle = HandshakeThrottle(2, clock=clock)
    # One host rotating through addresses of its /64 shares one budget...
    throttle.failed("2001:db8:aa:bb::1")
    throttle.failed("2001:db8:aa:bb:ffff:ffff:ffff:ffff")
    assert not throttle.allow("2001:db8:aa:bb:1234::9")
    assert throttle.refusals("2001:db8:aa:bb::77") == 1
    # ...and the neighbouring /64 has its own.
    assert throttle.allow("2001:db8:aa:bc::1")
    assert len(throttle) == 1


def test_ipv4_mapped_ipv6_shares_the_ipv4_budget(clock: Clock) -> None:
    throttle = HandshakeThrottle(2, clock=clock)
    throttle.failed("192.0.2.7")
    throttle.failed("::ffff:192.0.2.7")
    assert not throttle.allow("192.0.2.7")
    throttle.succeeded("::ffff:c000:207")  # the same address, written in hex
    assert throttle.allow("192.0.2.7")


# --------------------------------------------------------------------------
# Bounded memory


def test_memory_is_bounded_and_the_least_recently_used_goes_first(clock: Clock) -> None:
    throttle = HandshakeThrottle(1, clock=clock, max_addresses=3)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        throttle.failed(address)
    assert not throttle.allow("10.0.0.1")  # touched: now the most recently used

    throttle.failed("10.0.0.4")  # full: forgets 10.0.0.2, the least recently used

    assert len(throttle) == 3
    assert throttle.allow("10.0.0.2")  # forgotten: a full budget again
    assert not throttle.allow("10.0.0.1")
    assert not throttle.allow("10.0.0.3")
    assert not throttle.allow("10.0.0.4")


def test_a_flood_of_addresses_never_grows_past_the_bound(clock: Clock) -> None:
    throttle = HandshakeThrottle(5, clock=clock, max_addresses=100)
    for n in range(10_000):
        throttle.failed(f"2001:db8:{n >> 16:x}:{n & 0xFFFF:x}::1")  # 10,000 distinct /64s
        assert len(throttle) <= 100
    assert len(throttle) == 100


def test_the_default_bound() -> None:
    assert HandshakeThrottle(10).max_addresses == 100_000


# --------------------------------------------------------------------------
# On a real broker


async def refused(gateway: Gateway, token: str) -> tuple[int, dict[str, str], bytes]:
    with pytest.raises(InvalidStatus) as info:
        await gateway.websocket("/tube", additional_headers={"Authorization": f"Bearer {token}"})
    response = info.value.response
    headers = {name.lower(): value for name, value in response.headers.raw_items()}
    return response.status_code, headers, response.body or b""


@pytest.mark.anyio
@pytest.mark.parametrize("server_name", SERVERS)
async def test_failed_handshakes_then_429_even_with_a_valid_credential(
    make_gateway: GatewayFactory, server_name: str
) -> None:
    gateway = await make_gateway(server=server_name, failed_handshakes_per_minute=3)
    stranger = gateway.token("billing", key=gateway.keys.stranger)
    for _ in range(3):
        status, _, body = await refused(gateway, stranger)
        assert status == 401
        assert_fault(decode(body), 3101)

    status, headers, body = await refused(gateway, gateway.token("billing"))

    assert status == 429
    assert headers["content-type"] == "application/asbp"
    assert 1 <= int(headers["retry-after"]) <= 20  # one failure refills every 20 s
    fault = decode(body)
    assert_fault(fault, 3101)
    assert fault.body == b"too many failed handshakes from this address; retry later"
    (record,) = gateway.events.find("tube.refused", reason="throttled")
    assert record.levelno == logging.WARNING
    assert not gateway.events.find("tube.open")
    assert len(gateway.events.find("tube.refused", reason="bad_signature")) == 3

    # A flood of throttled attempts is logged once as a warning, then at debug level.
    await refused(gateway, gateway.token("billing"))
    records = gateway.events.find("tube.refused", reason="throttled")
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    assert vars(records[1])["refusals"] == 2

    # User-Agent Channels are not throttled.
    user = await gateway.channel()
    assert user.greeting.name == "asbp.channel"


@pytest.mark.anyio
async def test_successful_handshakes_cost_nothing_and_reset_the_count(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(failed_handshakes_per_minute=3)
    stranger = gateway.token("search", key=gateway.keys.stranger)
    for _ in range(5):  # more than the budget, all accepted
        await gateway.tube("search")
    for _ in range(2):
        assert (await refused(gateway, stranger))[0] == 401
    await gateway.tube("billing")  # forgets the two failures
    for _ in range(3):
        assert (await refused(gateway, stranger))[0] == 401
    assert (await refused(gateway, stranger))[0] == 429


def test_exports() -> None:
    import gateway.auth.throttle

    assert all(hasattr(gateway.auth.throttle, name) for name in gateway.auth.throttle.__all__)
