"""Claims on the Redis plane: a Channel whose holder died goes to one broker only.

When the home of an HTTP Channel dies, each broker serving its requests (a
visitor: gateway.routing.http_bus) may notice at the same moment. Writing
itself into the directory (``HSET ch``) would let all of them win, and each
would join the Channel's groups again, so a ``g`` would reach it once per
winner. :data:`CLAIM` is the compare-and-set instead: one script in the
directory's slot (gateway/plane/redis/keys.py) that reads the entry, checks
its holder's lease beside it, and swaps it for the claimant only if the holder
is gone; Redis runs one script at a time, so of two claims on one Channel the
second sees the first's winner alive.

Kept apart from gateway/plane/redis/scripts.py (the forwarding path) so that
the two change independently.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.engines.redis.calls import script_command
from gateway.engines.redis.scripts import Script

__all__ = ["CLAIM", "CLAIM_SCRIPTS", "claim_command", "claimed"]

#: KEYS: ch, chz, chs:<self>; ARGV: prefix, channel, self. Returns the holder
#: afterwards: ``self`` when the entry named nobody, ``self`` or a broker whose
#: ``alive:<b>`` lapsed (that broker's ``chs:<b>`` forgets the Channel, so its
#: sweep leaves the new entry alone: the sweep checks the holder too).
CLAIM: Final = Script(
    "plane_claim_channel",
    """
local holder = redis.call('HGET', KEYS[1], ARGV[2])
if holder and holder ~= ARGV[3] then
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. holder) == 1 then return holder end
  redis.call('SREM', ARGV[1] .. 'chs:' .. holder, ARGV[2])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
return ARGV[3]
""",
)

CLAIM_SCRIPTS: Final = (CLAIM,)


def claim_command(prefix: str, broker_id: str, channel_id: str) -> tuple[Any, ...]:
    """The call that claims ``channel_id`` for ``broker_id``; ``prefix`` is the
    directory's (hash-tagged)."""
    keys = (f"{prefix}ch", f"{prefix}chz", f"{prefix}chs:{broker_id}")
    return script_command(CLAIM, keys, (prefix, channel_id, broker_id))


def claimed(reply: Any) -> str:
    """The holder a claim's reply names."""
    return reply.decode() if isinstance(reply, bytes) else str(reply)
