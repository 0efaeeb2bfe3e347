"""The Lua scripts of the Redis plane: each lookup and its forward are one script call.

A forward must find its target and hand the envelope over atomically: a
lookup, a round trip, then an XADD would cost two round trips and could write
to the stream of a broker that died in between. So each forward is one
script: it finds a live broker and XADDs to that broker's inbound stream, or
returns nil.

Keys, all under the prefix passed as ``ARGV[1]`` (see
:mod:`gateway.plane.redis.plane`): ``alive:<b>`` (the lease), ``brokers`` (every
broker that joined), ``ch`` (Channel → broker), ``chs:<b>`` (a broker's
Channels), ``name:<n>`` (brokers serving a Command-Name), ``names:<b>`` (a
broker's Command-Names), ``in:<b>`` (a broker's inbound stream), ``turn`` (the
round-robin counter). Stream entries carry ``k o i g f``: kind, origin broker,
Channel, the ``among`` agents joined by ``,``, and the frame.
"""

from __future__ import annotations

from typing import Final

from gateway.engines.redis.scripts import Script

__all__ = ["FORWARD_CHANNEL", "FORWARD_REQUEST", "LEAVE", "SCRIPTS", "SEND_TO", "SWEEP"]

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
  redis.call('DEL', chs, names, prefix .. 'in:' .. b, prefix .. 'alive:' .. b)
  redis.call('SREM', prefix .. 'brokers', b)
end
"""

#: ARGV: prefix, self, kind, channel, among, frame, maxlen; KEYS: name:<n>.
FORWARD_REQUEST: Final = Script(
    "plane_forward_request",
    """
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
redis.call('XADD', prefix .. 'in:' .. target, 'MAXLEN', '~', ARGV[7], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', ARGV[5], 'f', ARGV[6])
return target
""",
)

#: ARGV: prefix, self, kind, channel, frame, maxlen; KEYS: ch.
FORWARD_CHANNEL: Final = Script(
    "plane_forward_channel",
    """
local target = redis.call('HGET', KEYS[1], ARGV[4])
if not target or redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return false end
redis.call('XADD', ARGV[1] .. 'in:' .. target, 'MAXLEN', '~', ARGV[6], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', '', 'f', ARGV[5])
return target
""",
)

#: ARGV: prefix, self, kind, channel, frame, maxlen, target.
SEND_TO: Final = Script(
    "plane_send_to",
    """
local target = ARGV[7]
if redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return 0 end
redis.call('XADD', ARGV[1] .. 'in:' .. target, 'MAXLEN', '~', ARGV[6], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', '', 'f', ARGV[5])
return 1
""",
)

#: ARGV: prefix, broker: that broker's entries dropped (it leaves, or joins afresh).
LEAVE: Final = Script(
    "plane_leave",
    _FORGET
    + """
forget(ARGV[1], ARGV[2])
return 1
""",
)

#: ARGV: prefix: every broker whose lease ran out forgotten; returns how many.
SWEEP: Final = Script(
    "plane_sweep",
    _FORGET
    + """
local swept = 0
for _, b in ipairs(redis.call('SMEMBERS', ARGV[1] .. 'brokers')) do
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 0 then
    forget(ARGV[1], b)
    swept = swept + 1
  end
end
return swept
""",
)

#: KEYS: ch, chs:<self>; ARGV: channel, self. The directory entry dropped only if it
#: is still this broker's: on a bus, several brokers serve one HTTP Channel, and
#: the one that stops must not unlist it for the others.
CHANNEL_CLOSED: Final = Script(
    "plane_channel_closed",
    """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
""",
)

SCRIPTS: Final = (FORWARD_REQUEST, FORWARD_CHANNEL, SEND_TO, LEAVE, SWEEP, CHANNEL_CLOSED)
