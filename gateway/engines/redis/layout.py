"""Where the Redis engine's keys live: on one Redis, or spread over a Redis Cluster's slots.

A Lua script on a Redis Cluster may touch only keys of one hash slot, and a
queue's script touches the queue's keys *and* the index of queues waiting for
the sweep (:mod:`gateway.engines.redis.expiry`), which a release, an enqueue
and a virtual-queue copy lower in the same script. So on a cluster the queues
are dealt into :data:`CLUSTER_SHARDS` *shards*, each a hash tag of its own
(``asbp:{q<j>}:``) that holds its queues' keys and its own expiry index: every
per-message script touches one slot, as on one Redis. A queue's shard is
a hash of its name (:func:`~gateway.engines.redis.sharded.spread`) modulo the
number of shards; the tags are picked so that no two shards share a
slot, so the shards (and the work) spread over every primary rather than pile
on one (the trap of one tag for everything, centrifugal/centrifuge#554). A
queue per tag (``{q:<name>}``) would spread as well, but then its scripts could
not lower an index in the same slot, and the sweeper would need a protocol to
keep a cross-slot index right; with shards it reads one index per shard.

What crosses shards is split out of the per-message scripts:

- the registry of queues (``max_queues``) sits with the virtual queues in the
  slot of ``asbp:vqueues``; an engine registers a queue once, on its first
  enqueue there, before storing into it (:mod:`gateway.engines.redis.registry`);
- a topic publication checks the virtual-queue version in that slot, then
  copies into its virtual queues with one script call per shard they live in
  (one per slot), and publishes on a shard channel (``SPUBLISH``, spread over
  :data:`TOPIC_SHARDS` slots; :mod:`gateway.engines.redis.sharded`).

Notices and wake-ups are published from inside the queue scripts, and a
script may ``SPUBLISH`` only in its own slot: on a cluster a channel
``asbp:<rest>`` (a queue's wake-up channel ``asbp:wake:<Q>``, a broker's notice
channel ``asbp:notices:<b>``) goes out on its shard's ``asbp:{q<j>}:<rest>``
(:meth:`KeyLayout.shard_channel`, the rule the scripts' ``publish`` helper
follows). A waiter subscribes to its queue's one; a broker holds its notice
channel of every shard (64 ``SSUBSCRIBE``s, spread over the primaries with the
shards). On one Redis both stay classic ``PUBLISH`` under their plain names.

On one Redis there are no slots: one shard, the key names of before (queues
under ``asbp:q:``, the index ``{asbp:vqueues}:expiry``, the registry
``asbp:queues``), and a publication stays one script call that checks the
version, publishes and copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from redis.crc import key_slot

from gateway.engines.redis.calls import (
    EXPIRY,
    KEY_PREFIX,
    NOTICES,
    REGISTRY,
    TOPICS,
    VQUEUES,
    WAKE,
    QueueKeys,
)
from gateway.engines.redis.sharded import shard_channels, spread

__all__ = [
    "CLUSTER_REGISTRY",
    "CLUSTER_SHARDS",
    "TOPIC_SHARDS",
    "KeyLayout",
    "cluster_layout",
    "single_layout",
]

#: Shards of queues on a Redis Cluster: enough to spread over the primaries of
#: a large cluster, few enough that the sweeper's one read per shard is cheap.
CLUSTER_SHARDS: Final = 64
#: Shard channels for topic publications on a Redis Cluster (each broker holds
#: them all; a topic's messages keep to one, so their order holds).
TOPIC_SHARDS: Final = 16
#: The registry on a cluster: in the virtual queues' slot, which the declare
#: script writes together with it.
CLUSTER_REGISTRY: Final = "{" + VQUEUES + "}:queues"

_WAKE: Final = WAKE.encode()
_WAKE_REST: Final = WAKE.removeprefix(KEY_PREFIX).encode()
_TAGGED: Final = (KEY_PREFIX + "{").encode()


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The engine's key names; see the module docstring.

    Attributes:
        cluster: keys are spread over a cluster's slots (shards, sharded topics).
        registry: the set of every queue and virtual queue.
        prefixes: per shard, the prefix of its queues' keys.
        expiries: per shard, its index of queues by next sweep.
        topic_channels: the shard channels of topic publications (cluster only).
        tags: per shard, its hash tag (cluster only).
    """

    cluster: bool
    registry: str
    prefixes: tuple[str, ...]
    expiries: tuple[str, ...]
    topic_channels: tuple[bytes, ...] = ()
    tags: tuple[str, ...] = ()

    def shard(self, queue: str) -> int:
        """The shard ``queue`` lives in (always 0 on one Redis)."""
        shards = len(self.prefixes)
        if shards == 1:
            return 0
        return spread(queue, shards)

    def shard_channel(self, channel: str, shard: int) -> bytes:
        """Where the scripts of ``shard`` publish ``channel`` (an ``asbp:`` name)."""
        if not self.cluster:
            return channel.encode()
        return f"{KEY_PREFIX}{self.tags[shard]}:{channel.removeprefix(KEY_PREFIX)}".encode()

    def wake_channel(self, queue: str) -> bytes:
        """The channel ``queue``'s wake-ups arrive on."""
        return self.shard_channel(WAKE + queue, self.shard(queue))

    def notice_channels(self, broker_id: str) -> tuple[bytes, ...]:
        """The channels a broker's notices arrive on: one per shard."""
        return tuple(
            self.shard_channel(NOTICES + broker_id, shard) for shard in range(len(self.prefixes))
        )

    def woken_queue(self, channel: bytes) -> str | None:
        """The queue whose wake-up channel ``channel`` is; None if it is none."""
        if self.cluster:
            # asbp:{q<j>}:wake:<Q>: the tag holds no '}', so the first '}:' ends it.
            if not channel.startswith(_TAGGED):
                return None
            end = channel.find(b"}:")
            rest = channel[end + 2 :] if end >= 0 else b""
            return rest[len(_WAKE_REST) :].decode() if rest.startswith(_WAKE_REST) else None
        return channel[len(_WAKE) :].decode() if channel.startswith(_WAKE) else None

    def queue_keys(self, queue: str) -> QueueKeys:
        """``queue``'s keys: in its shard's slot, with its shard's expiry index."""
        shard = self.shard(queue)
        # On a cluster the enqueue script does not touch the registry (another
        # slot): the registration is a call of its own (registry.py).
        return QueueKeys(
            queue,
            prefix=self.prefixes[shard],
            expiry=self.expiries[shard],
            registry=None if self.cluster else self.registry,
            wait_replicas=self.cluster,
        )


def single_layout() -> KeyLayout:
    """One Redis: one shard, the key names the engine always had."""
    return KeyLayout(
        cluster=False,
        registry=REGISTRY,
        prefixes=(KEY_PREFIX + "q:",),
        expiries=(EXPIRY,),
        topic_channels=(TOPICS.encode(),),
    )


def cluster_layout(shards: int = CLUSTER_SHARDS, topic_shards: int = TOPIC_SHARDS) -> KeyLayout:
    """A Redis Cluster: ``shards`` hash tags in distinct slots (the same on every broker)."""
    tags: list[str] = []
    slots: set[int] = set()
    number = 0
    while len(tags) < shards:
        tag = f"{{q{number}}}"
        slot = key_slot(tag.encode())
        if slot not in slots:
            slots.add(slot)
            tags.append(tag)
        number += 1
    return KeyLayout(
        cluster=True,
        registry=CLUSTER_REGISTRY,
        prefixes=tuple(f"{KEY_PREFIX}{tag}:q:" for tag in tags),
        expiries=tuple(f"{KEY_PREFIX}{tag}:expiry" for tag in tags),
        topic_channels=tuple(shard_channels(TOPICS + ":", topic_shards)),
        tags=tuple(tags),
    )
