"""Delivery notices (``asbp.notice``) back to the publisher that asked for them.

Notices come from the engine with the ``notify`` address given at
publication, ``<broker>/<c|t>/<Channel- or Tube id>/<u>``: only this broker's
notices reach it (the engine routes on the prefix), and the rest names the
client's endpoint and the publication's ``u``. A notice that arrives before
the publication's ``asbp.accepted`` is held until the acceptance is sent, so
a publisher always learns the message id first.
"""

from __future__ import annotations

from gateway.engines.base import DeliveryNotice
from gateway.messaging.notifications import notice
from gateway.messaging.subscriptions import Endpoint

__all__ = ["DeliveryNotices"]


class DeliveryNotices:
    """Routes the engine's notices to endpoints, holding early ones.

    Args:
        broker_id: this broker, the prefix of every notice address it gives.
        endpoints: the open endpoints by key (gateway.messaging.endpoints).
    """

    __slots__ = ("_endpoints", "_held", "prefix")

    def __init__(self, broker_id: str, endpoints: dict[str, Endpoint]) -> None:
        #: What every ``notify`` address this broker gives starts with.
        self.prefix = broker_id + "/"
        self._endpoints = endpoints
        #: Notices for publications whose asbp.accepted has not been sent yet.
        self._held: dict[str, list[DeliveryNotice]] = {}

    def address(self, endpoint: Endpoint, command_id: int | None) -> str:
        """The ``notify`` address of a publication by ``endpoint`` with ``u`` ``command_id``."""
        # "<broker>/<c|t>/<id>/<u>": the engine routes on the broker, we on the rest.
        return f"{self.prefix}{endpoint.key}/{'' if command_id is None else command_id}"

    def hold(self, message_id: str) -> None:
        """Hold the notices of ``message_id`` until :meth:`accepted` (or :meth:`abandon`)."""
        self._held[message_id] = []

    def abandon(self, message_id: str) -> None:
        """The publication failed: no acceptance comes, nor do its held notices."""
        self._held.pop(message_id, None)

    def accepted(self, message_id: str) -> None:
        """The publication's ``asbp.accepted`` was sent: its held notices follow."""
        held = self._held.pop(message_id, None)
        if held:
            for notice_held in held:
                self.on_notice(notice_held)

    def on_notice(self, event: DeliveryNotice) -> None:
        """A notice from the engine: held, sent to its endpoint, or dropped."""
        held = self._held.get(event.message_id)
        if held is not None:
            held.append(event)
            return
        address = event.notify
        prefix = self.prefix
        if not address.startswith(prefix):
            return
        key, _, raw_id = address[len(prefix) :].rpartition("/")
        endpoint = self._endpoints.get(key)
        if endpoint is None or endpoint.closed:
            return
        command_id = int(raw_id) if raw_id.isdigit() else None
        endpoint.send(notice(event, command_id=command_id))
