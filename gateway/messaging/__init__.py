"""Topics, queues and virtual queues for User-Agents and Application-Agents.

The messaging built-ins (``asbp.publish``, ``asbp.subscribe``,
``asbp.unsubscribe``, ``asbp.poll``, ``asbp.ack``) and what the broker sends
back (``asbp.notification``, ``asbp.notice``, ``asbp.accepted``), on top of an
engine (gateway.engines). docs/protocol.md, "Topics and queues", is the
reference. The parts:

- :mod:`~gateway.messaging.requests`: Commands read into requests; destination
  names, types and QoS keys checked (pure).
- :mod:`~gateway.messaging.notifications`: the Commands sent back (pure).
- :mod:`~gateway.messaging.subscriptions`: endpoints (one per Channel or Tube)
  and the topic subscription registry.
- :mod:`~gateway.messaging.consumers`: one task per queue with subscribers,
  handing leased messages out.
- :mod:`~gateway.messaging.system_topics`: ``/system/stats/…`` and
  ``/system/faults/<broker>``.
- :mod:`~gateway.messaging.service`: :class:`Messaging`, which the router calls.
"""

from __future__ import annotations

from gateway.messaging.service import Messaging

__all__ = ["Messaging"]
