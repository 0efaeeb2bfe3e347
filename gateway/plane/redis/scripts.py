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
Channel, the ``among`` agents (or groups) joined by line feeds, and the frame.
"""

from __future__ import annotations

from typing import Final

from gateway.engines.redis.scripts import Script

__all__ = [
    "DONE",
    "FORWARD_CHANNEL",
    "FORWARD_EACH",
    "FORWARD_REQUEST",
    "LEAVE",
    "REPORT",
    "SCRIPTS",
    "SEND_TO",
    "SWEEP",
]

_FORGET: Final = """
-- Forgets at most ``budget`` entries of broker ``b``; returns what is left of the
-- budget, and whether ``b`` is gone whole. A broker that held a million Channels
-- is swept over many calls, so no single call holds Redis for long.
local function forget(prefix, b, budget)
  local chs = prefix .. 'chs:' .. b
  local names = prefix .. 'names:' .. b
  local popped = redis.call('SPOP', chs, budget)
  for _, c in ipairs(popped) do
    if redis.call('HGET', prefix .. 'ch', c) == b then redis.call('HDEL', prefix .. 'ch', c) end
  end
  budget = budget - #popped
  if budget > 0 then
    local served = redis.call('SPOP', names, budget)
    for _, n in ipairs(served) do
      redis.call('HDEL', prefix .. 'name:' .. n, b)
      redis.call('HDEL', prefix .. 'fwd:' .. n, b)
    end
    budget = budget - #served
  end
  local grps = prefix .. 'grps:' .. b
  if budget > 0 then
    local held = redis.call('SPOP', grps, budget)
    for _, g in ipairs(held) do
      redis.call('HDEL', prefix .. 'grp:' .. g, b)
    end
    budget = budget - #held
  end
  if redis.call('EXISTS', chs, names, grps) > 0 then return budget, false end
  redis.call('DEL', prefix .. 'in:' .. b, prefix .. 'alive:' .. b)
  redis.call('SREM', prefix .. 'brokers', b)
  return budget, true
end
"""

#: ARGV: prefix, self, kind, channel, among, frame, maxlen, balance; KEYS: name:<n>,
#: whose values are each broker's Commands in flight for the name, and fwd:<n>. ``in_flight``:
#: the least loaded live broker (ties in turn), whose count goes up by one at
#: once, so a burst spreads before the next report; ``turns``: each in turn.
FORWARD_REQUEST: Final = Script(
    "plane_forward_request",
    """
local prefix = ARGV[1]
local live = {}
local loads = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local b = fields[i]
  if b ~= ARGV[2] and redis.call('EXISTS', prefix .. 'alive:' .. b) == 1 then
    live[#live + 1] = b
    loads[b] = tonumber(fields[i + 1]) or 0
  end
end
if #live == 0 then return false end
table.sort(live)
local turn = redis.call('INCR', prefix .. 'turn')
local target = live[(turn % #live) + 1]
if ARGV[8] == 'in_flight' then
  for k = 1, #live - 1 do
    local b = live[((turn + k) % #live) + 1]
    if loads[b] < loads[target] then target = b end
  end
  redis.call('HINCRBY', KEYS[1], target, 1)
  redis.call('HINCRBY', KEYS[2], target, 1)
end
redis.call('XADD', prefix .. 'in:' .. target, 'MAXLEN', '~', ARGV[7], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', ARGV[5], 'f', ARGV[6])
return target
""",
)

#: ARGV: prefix, self, kind, channel, frame, maxlen, among; KEYS: ch. A JOIN
#: (kind ``j``) also writes the target into each group's directory entry, so a
#: GROUP forwarded after it finds the target before the target has read the join.
FORWARD_CHANNEL: Final = Script(
    "plane_forward_channel",
    """
local target = redis.call('HGET', KEYS[1], ARGV[4])
if not target or redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return false end
redis.call('XADD', ARGV[1] .. 'in:' .. target, 'MAXLEN', '~', ARGV[6], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', ARGV[7], 'f', ARGV[5])
if ARGV[3] == 'j' then
  for g in string.gmatch(ARGV[7], '[^\\n]+') do
    redis.call('HSET', ARGV[1] .. 'grp:' .. g, target, '1')
    redis.call('SADD', ARGV[1] .. 'grps:' .. target, g)
  end
end
return target
""",
)

#: ARGV: prefix, self, kind, channel, frame, maxlen, among; KEYS: hashes whose
#: fields are brokers (``grp:<g>`` per group, or ``name:<n>``). To every live
#: broker in any of them but this one, once; returns them.
FORWARD_EACH: Final = Script(
    "plane_forward_each",
    """
local seen = {}
local targets = {}
for _, key in ipairs(KEYS) do
  for _, b in ipairs(redis.call('HKEYS', key)) do
    if b ~= ARGV[2] and not seen[b] then
      seen[b] = true
      if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 1 then
        targets[#targets + 1] = b
        redis.call('XADD', ARGV[1] .. 'in:' .. b, 'MAXLEN', '~', ARGV[6], '*',
          'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', ARGV[7], 'f', ARGV[5])
      end
    end
  end
end
return targets
""",
)

#: ARGV: prefix, self, kind, channel, frame, maxlen, target, among.
SEND_TO: Final = Script(
    "plane_send_to",
    """
local target = ARGV[7]
if redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return 0 end
redis.call('XADD', ARGV[1] .. 'in:' .. target, 'MAXLEN', '~', ARGV[6], '*',
  'k', ARGV[3], 'o', ARGV[2], 'i', ARGV[4], 'g', ARGV[8], 'f', ARGV[5])
return 1
""",
)

#: ARGV: broker, in flight there, requests it read since it started serving the name;
#: KEYS: name:<n>, fwd:<n> (requests forwarded to each broker since it started
#: serving it). The count becomes what is in flight plus what is on its way, and only
#: while the broker serves the name.
REPORT: Final = Script(
    "plane_report",
    """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local forwarded = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local load = tonumber(ARGV[2]) + math.max(0, forwarded - tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], ARGV[1], load)
return load
""",
)

#: ARGV: broker, how many; KEYS: name:<n>: that many fewer in flight there, if it
#: still serves the name (an HINCRBY alone would bring back a broker that stopped).
DONE: Final = Script(
    "plane_done",
    """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2]))
end
return 0
""",
)

#: ARGV: prefix, broker, batch: at most ``batch`` of that broker's entries dropped
#: (it leaves, or joins afresh); returns 1 once all are gone, 0 if some are left.
LEAVE: Final = Script(
    "plane_leave",
    _FORGET
    + """
local _, gone = forget(ARGV[1], ARGV[2], tonumber(ARGV[3]))
if gone then return 1 end
return 0
""",
)

#: ARGV: prefix, batch: at most ``batch`` entries of brokers whose lease ran out
#: forgotten; returns how many such brokers are gone whole and whether entries
#: are left over for another call ``{swept, more}``.
SWEEP: Final = Script(
    "plane_sweep",
    _FORGET
    + """
local budget = tonumber(ARGV[2])
local swept = 0
for _, b in ipairs(redis.call('SMEMBERS', ARGV[1] .. 'brokers')) do
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 0 then
    if budget <= 0 then return {swept, 1} end
    local gone
    budget, gone = forget(ARGV[1], b, budget)
    if not gone then return {swept, 1} end
    swept = swept + 1
  end
end
return {swept, 0}
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

SCRIPTS: Final = (
    REPORT,
    DONE,
    FORWARD_REQUEST,
    FORWARD_CHANNEL,
    FORWARD_EACH,
    SEND_TO,
    LEAVE,
    SWEEP,
    CHANNEL_CLOSED,
)
