"""When a broker lifts the release barriers it put up (gateway.plane.redis.release_barriers).

Pure bookkeeping: the reader's position against the newest entry of the inbound
stream after each release; the lift is what the plane would submit.
"""

from __future__ import annotations

import pytest

from gateway.plane.redis.release_barriers import ReleaseBarriers, entry_order


@pytest.mark.parametrize(
    ("entry_id", "order"),
    [(b"0-0", (0, 0)), (b"1700000000000-12", (1700000000000, 12)), (b"5", (5, 0))],
)
def test_entry_ids_order_as_redis_orders_them(entry_id: bytes, order: tuple[int, int]) -> None:
    assert entry_order(entry_id) == order
    assert entry_order(b"9-10") > entry_order(b"9-9")  # not as text would


def test_a_barrier_lifts_once_the_reader_has_handled_the_newest_entry_at_the_release() -> None:
    lifted: list[str] = []
    barriers = ReleaseBarriers(lifted.append)
    barriers.released("empty", None)  # nothing was on its way: at once
    assert lifted == ["empty"]
    barriers.handled(b"10-0")
    barriers.released("handled", b"9-5")  # the reader is past it already: at once
    assert lifted == ["empty", "handled"]
    barriers.released("x", b"12-0")
    barriers.released("y", b"11-3")
    barriers.released("x", b"11-0")  # released again, earlier: the later entry stands
    barriers.handled(b"11-2")
    assert lifted == ["empty", "handled"]
    barriers.handled(b"11-3")
    assert lifted == ["empty", "handled", "y"]
    barriers.handled(b"12-0")
    assert lifted == ["empty", "handled", "y", "x"]
    barriers.handled(b"13-0")  # lifted once each
    assert lifted == ["empty", "handled", "y", "x"]
