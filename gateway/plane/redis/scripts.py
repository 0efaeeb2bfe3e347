"""The Lua scripts of the Redis plane: lookups in the directory, and sends to a stream.

Keys (see :mod:`gateway.plane.redis.keys` for which share a slot and why):
the directory's, all under the tagged prefix passed as ``ARGV[1]``:
``alive:<b>`` (the lease), ``brokers`` (every broker that joined), ``ch``
(Channel → broker), ``chs:<b>`` (a broker's Channels), ``name:<n>`` (brokers
serving a Command-Name), ``names:<b>`` (a broker's Command-Names), ``turn``
(the round-robin counter); and each broker's inbound stream with the copy of
its lease beside it, in a slot of their own.

On a Redis Cluster a forward is two script calls: a lookup in the directory's
slot that returns a live target, then a send in the target stream's slot that
XADDs only if the target's lease (the copy beside its stream) still holds, so a
forward to a broker that died in between is refused, never written where nobody
reads. On one Redis, where a script may touch any key, the lookup is given the
envelope too (ARGV beyond the first two) and sends it itself: one round trip
per forward, as before the cluster (bench/cluster.py measured the second trip
at about a third of the two-broker throughput). Every
script declares its first key, so that a Redis Cluster runs it on the primary
serving that slot; the keys it derives share that key's hash tag. Stream
entries carry ``k o i g f``: kind, origin broker, Channel, the ``among``
agents joined by ``,``, and the frame.
"""

from __future__ import annotations

from typing import Final

from gateway.engines.redis.scripts import Script

__all__ = ["FORWARD_CHANNEL", "FORWARD_REQUEST", "LEAVE", "SCRIPTS", "SEND_TO", "SWEEP"]

_SEND: Final = """
local function send(stream_prefix, target, origin, kind, channel, among, frame, maxlen)
  local stream = '{' .. stream_prefix .. 'in:' .. target .. '}'
  if redis.call('EXISTS', stream .. 'live') == 0 then return false end
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'k', kind, 'o', origin, 'i', channel, 'g', among, 'f', frame)
  return true
end
"""

_FORGET: Final = """
local function forget(prefix, b)
  local chs = prefix .. 'chs:' .. b
  local names = prefix .. 'names:' .. b
  for _, c in ipairs(redis.call('SMEMBERS', chs)) do
    if redis.call('HGET', prefix .. 'ch', c) == b then redis.call('HDEL', prefix .. 'ch', c) end
  end
  for _, n in ipairs(redis.call('SMEMBERS', names)) do
    redis.call('HDEL', prefix .. 'name:' .. n, b)
  end
  redis.call('DEL', chs, names, prefix .. 'alive:' .. b)
  redis.call('SREM', prefix .. 'brokers', b)
end
"""

#: KEYS: name:<n>; ARGV: prefix, self[, stream prefix, kind, channel, among, frame,
#: maxlen]. A live broker serving the name, in turn; with the envelope, sent to it.
FORWARD_REQUEST: Final = Script(
    "plane_forward_request",
    _SEND
    + """
local prefix = ARGV[1]
local live = {}
for _, b in ipairs(redis.call('HKEYS', KEYS[1])) do
  if b ~= ARGV[2] and redis.call('EXISTS', prefix .. 'alive:' .. b) == 1 then
    live[#live + 1] = b
  end
end
if #live == 0 then return false end
table.sort(live)
local target = live[(redis.call('INCR', prefix .. 'turn') % #live) + 1]
if #ARGV > 2 and not send(ARGV[3], target, ARGV[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
then return false end
return target
""",
)

#: KEYS: ch; ARGV: prefix, channel[, stream prefix, self, kind, among, frame, maxlen].
#: The live broker holding the Channel; with the envelope, sent to it.
FORWARD_CHANNEL: Final = Script(
    "plane_forward_channel",
    _SEND
    + """
local target = redis.call('HGET', KEYS[1], ARGV[2])
if not target or redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return false end
if #ARGV > 2 and not send(ARGV[3], target, ARGV[4], ARGV[5], ARGV[2], ARGV[6], ARGV[7], ARGV[8])
then return false end
return target
""",
)

#: KEYS: the target's stream, the lease beside it; ARGV: self, kind, channel, among,
#: frame, maxlen. 1 if added, 0 if the target's lease is gone.
SEND_TO: Final = Script(
    "plane_send_to",
    """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[6], '*',
  'k', ARGV[2], 'o', ARGV[1], 'i', ARGV[3], 'g', ARGV[4], 'f', ARGV[5])
return 1
""",
)

#: KEYS: brokers; ARGV: prefix, broker: that broker's directory entries dropped (it
#: leaves, or joins afresh). Its stream, in another slot, is deleted by the caller.
LEAVE: Final = Script(
    "plane_leave",
    _FORGET
    + """
forget(ARGV[1], ARGV[2])
return 1
""",
)

#: KEYS: brokers; ARGV: prefix: every broker whose lease ran out forgotten; returns
#: their identifiers, whose streams (in other slots) the caller deletes.
SWEEP: Final = Script(
    "plane_sweep",
    _FORGET
    + """
local swept = {}
for _, b in ipairs(redis.call('SMEMBERS', ARGV[1] .. 'brokers')) do
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 0 then
    forget(ARGV[1], b)
    swept[#swept + 1] = b
  end
end
return swept
""",
)

SCRIPTS: Final = (FORWARD_REQUEST, FORWARD_CHANNEL, SEND_TO, LEAVE, SWEEP)
