"""Where the Redis plane's keys live: which share a slot, and why.

On a Redis Cluster, the keys one script touches must share a hash slot, and a
hash tag (the part of a key between the first ``{`` and ``}``) is what puts
keys in one slot. The plane has two kinds of keys:

- *The directory*, tagged ``{<prefix>}``: ``ch`` (and ``chz``, its Channel
  identifiers in a sorted set for paging), ``chs:<b>``, ``name:<n>``,
  ``names:<b>``, ``grp:<g>``, ``grps:<b>``, ``addr:<address>`` (the brokers
  holding Subjects with a Conversation-Address), ``addrs:<b>``, ``brokers``,
  ``turn`` and each broker's lease ``alive:<b>``.
  A lookup checks leases while it reads the directory, and the sweep forgets
  a dead broker's entries in one script, so all of them live together in one
  slot (one primary). The directory is small and read on a miss only (the
  router asks its own broker first), so one slot carries it.
- *Each broker's inbound stream*, tagged ``{<prefix>in:<b>}``: the stream
  ``{<prefix>in:<b>}`` and beside it ``{<prefix>in:<b>}live``, a second copy
  of the lease that a send checks before it XADDs, atomically, in the
  stream's slot. Streams carry every forwarded Command, the plane's bulk, so
  each broker's is tagged by its own identifier and the streams spread over
  the slots (and primaries) as brokers are added.

On one Redis the tags change nothing but the key names.
"""

from __future__ import annotations

__all__ = ["directory_prefix", "live_key", "stream_key"]


def directory_prefix(prefix: str) -> str:
    """What every directory key starts with: the prefix as a hash tag."""
    return "{" + prefix + "}"


def stream_key(prefix: str, broker_id: str) -> str:
    """The inbound stream of ``broker_id``, in a slot of its own."""
    return "{" + prefix + "in:" + broker_id + "}"


def live_key(prefix: str, broker_id: str) -> str:
    """The lease beside ``broker_id``'s stream (same slot)."""
    return stream_key(prefix, broker_id) + "live"
