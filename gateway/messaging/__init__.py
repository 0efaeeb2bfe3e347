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
- :mod:`~gateway.messaging.service`: :class:`Messaging`, which the router calls
  (gateway.types.MessagingHooks): the façade over the parts below, and their
  life cycle.
- :mod:`~gateway.messaging.dispatch`: a Command on sight: read, checked, made
  an operation.
- :mod:`~gateway.messaging.acl_gate`: the access-control questions (3201).
- :mod:`~gateway.messaging.sequencing`: each sender's operations, carried out
  and answered in the order sent.
- :mod:`~gateway.messaging.polling`: ``asbp.poll``.
- :mod:`~gateway.messaging.subscribers`: this broker's topic subscriptions and
  queue consumers.
- :mod:`~gateway.messaging.delivery_notices`: ``asbp.notice``, held until the
  publication is accepted.
- :mod:`~gateway.messaging.endpoints`: endpoints by key, and outbox flow control.
- :mod:`~gateway.messaging.message_ids`: the pool message ids are drawn from.
- :mod:`~gateway.messaging.background`: what stopping waits for.
"""

from __future__ import annotations

from gateway.messaging.service import Messaging

__all__ = ["Messaging"]
