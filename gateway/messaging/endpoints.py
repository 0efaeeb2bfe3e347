"""This broker's messaging endpoints, one per Channel or Tube that used messaging.

An :class:`~gateway.messaging.subscriptions.Endpoint` is made on its client's
first messaging Command and bound then to where its frames and faults go
(:class:`~gateway.types.Outlets`): User-Agents and Application-Agents differ
only there. Endpoints are found by key (``c/<Channel-Identifier>`` or
``t/<Tube id>``), the part of a delivery notice's address that names the
client.

Flow control: a queue consumer that finds no room in a subscriber's outbox
does not poll it; it asks :meth:`Endpoints.watch` to wake it once that outbox
drains (gateway.connections.outboxes.Outbox.when_drained).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.messaging.subscriptions import Endpoint

if TYPE_CHECKING:
    from gateway.connections.channels import Channel
    from gateway.connections.outboxes import Outbox
    from gateway.connections.tubes import Tube
    from gateway.types import Outlets

__all__ = ["Endpoints"]


class Endpoints:
    """The endpoints by key, and each one's outbox for flow control.

    Args:
        outlets: where endpoints' frames and faults go.
    """

    __slots__ = ("_outboxes", "_outlets", "by_key")

    def __init__(self, outlets: Outlets) -> None:
        self._outlets = outlets
        #: Open endpoints, by key. Public for the hot path: a Command looks its
        #: endpoint up here with one dictionary lookup, and opens one only if missing.
        self.by_key: dict[str, Endpoint] = {}
        #: Each endpoint's outbox, for its queue consumers to wait on (:meth:`watch`).
        self._outboxes: dict[Endpoint, Outbox] = {}

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self.by_key.values())

    def open_channel(self, channel: Channel) -> Endpoint:
        """A new endpoint for ``channel`` (its key must not be open yet)."""
        outlets = self._outlets
        endpoint = Endpoint(
            "c/" + channel.id,
            functools.partial(outlets.deliver, channel),
            functools.partial(outlets.fault, channel),
            channel.outbox.room,
            send_delivery=functools.partial(outlets.deliver_delivery, channel),
        )
        self.by_key[endpoint.key] = endpoint
        self._outboxes[endpoint] = channel.outbox
        return endpoint

    def rebind(self, endpoint: Endpoint, channel: Channel) -> None:
        """``endpoint`` (parked while its Channel was away) serves ``channel``, the
        Channel resumed here under the same ``i``, from now on."""
        outlets = self._outlets
        endpoint.send = functools.partial(outlets.deliver, channel)
        endpoint.send_delivery = functools.partial(outlets.deliver_delivery, channel)
        endpoint.fault = functools.partial(outlets.fault, channel)
        endpoint.room = channel.outbox.room
        self._outboxes[endpoint] = channel.outbox

    def open_tube(self, tube: Tube) -> Endpoint:
        """A new endpoint for ``tube``, whose publications carry its ``a``."""
        outlets = self._outlets
        endpoint = Endpoint(
            "t/" + tube.id,
            functools.partial(outlets.send_tube_frame, tube),
            functools.partial(outlets.fault_tube, tube),
            tube.outbox.room,
            agent_id=tube.agent_id,
        )
        self.by_key[endpoint.key] = endpoint
        self._outboxes[endpoint] = tube.outbox
        return endpoint

    def pop(self, key: str) -> Endpoint | None:
        """Forget the endpoint ``key`` (its client closed); it, if it was open."""
        return self.by_key.pop(key, None)

    def release_outbox(self, endpoint: Endpoint) -> None:
        """``endpoint`` closed: its outbox no longer wakes anyone."""
        outbox = self._outboxes.pop(endpoint, None)
        if outbox is not None:
            outbox.when_drained(None)

    def watch(self, endpoint: Endpoint) -> None:
        """Wake ``endpoint``'s queue consumers once its outbox next drains."""
        outbox = self._outboxes.get(endpoint)
        if outbox is not None:
            outbox.when_drained(functools.partial(_drained, endpoint))


def _drained(endpoint: Endpoint) -> None:
    for consumer in endpoint.queues.values():
        consumer.wake()
