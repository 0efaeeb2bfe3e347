"""The Lua scripts of the Redis plane: lookups in the directory, and sends to a stream.

Keys (see :mod:`gateway.plane.redis.keys` for which share a slot and why):
the directory's, all under the tagged prefix passed as ``ARGV[1]``:
``alive:<b>`` (the lease), ``brokers`` (every broker that joined), ``ch``
(Channel → broker), ``chs:<b>`` (a broker's Channels), ``name:<n>`` (brokers
serving a Command-Name, each with its Commands in flight), ``fwd:<n>``
(requests forwarded to each of them), ``names:<b>`` (a broker's
Command-Names), ``grp:<g>`` (brokers holding members of a group), ``grps:<b>``
(a broker's groups), ``addr:<address>`` (brokers holding Subjects with a
Conversation-Address), ``addrs:<b>`` (a broker's addresses), ``turn`` (the
round-robin counter); and each broker's inbound stream with the copy of its
lease beside it, in a slot of their own.

On a Redis Cluster a forward is two script calls: a lookup in the directory's
slot that returns a live target (or targets), then a send in each target
stream's slot that XADDs only if the target's lease (the copy beside its
stream) still holds, so a forward to a broker that died in between is refused,
never written where nobody reads. On one Redis, where a script may touch any
key, the lookup is given the envelope too (ARGV beyond the lookup's own) and
sends it itself: one round trip per forward, as before the cluster
(bench/cluster.py measured the second trip at about a third of the two-broker
throughput). Every script declares its first key, so that a Redis Cluster runs
it on the primary serving that slot; the keys it derives share that key's hash
tag. Stream entries carry ``k o i g f``: kind, origin broker, Channel, the
``among`` agents (or groups) joined by line feeds, and the frame. A
User-Agent's requests and the answers for a Channel go packed, many to an
entry (:mod:`gateway.plane.redis.batches`, which has those scripts).
"""

from __future__ import annotations

from typing import Final

from gateway.engines.redis.scripts import Script

__all__ = [
    "DONE",
    "FORWARD_CHANNEL",
    "FORWARD_EACH",
    "LEAVE",
    "REPORT",
    "SCRIPTS",
    "SEND_TO",
    "SWEEP",
]

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
-- Forgets at most ``budget`` directory entries of broker ``b``; returns what is
-- left of the budget, and whether ``b`` is gone whole. A broker that held a
-- million Channels is swept over many calls, so no single call holds Redis for
-- long. Its stream, in another slot on a cluster, is deleted by the caller.
local function forget(prefix, b, budget)
  local chs = prefix .. 'chs:' .. b
  local names = prefix .. 'names:' .. b
  local popped = redis.call('SPOP', chs, budget)
  for _, c in ipairs(popped) do
    if redis.call('HGET', prefix .. 'ch', c) == b then
      redis.call('HDEL', prefix .. 'ch', c)
      redis.call('ZREM', prefix .. 'chz', c)
    end
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
  local addrs = prefix .. 'addrs:' .. b
  if budget > 0 then
    local held = redis.call('SPOP', addrs, budget)
    for _, a in ipairs(held) do
      redis.call('HDEL', prefix .. 'addr:' .. a, b)
    end
    budget = budget - #held
  end
  if redis.call('EXISTS', chs, names, grps, addrs) > 0 then return budget, false end
  redis.call('DEL', prefix .. 'alive:' .. b)
  redis.call('SREM', prefix .. 'brokers', b)
  return budget, true
end
"""

#: KEYS: ch; ARGV: prefix, channel, kind, among[, stream prefix, self, frame,
#: maxlen]. The live broker holding the Channel; with the envelope (one Redis),
#: sent to it. A JOIN (kind ``j``) also writes the target into each group's
#: directory entry, so a GROUP forwarded after it finds the target before the
#: target has read the join.
FORWARD_CHANNEL: Final = Script(
    "plane_forward_channel",
    _SEND
    + """
local target = redis.call('HGET', KEYS[1], ARGV[2])
if not target or redis.call('EXISTS', ARGV[1] .. 'alive:' .. target) == 0 then return false end
if #ARGV > 4 and not send(ARGV[5], target, ARGV[6], ARGV[3], ARGV[2], ARGV[4], ARGV[7], ARGV[8])
then return false end
if ARGV[3] == 'j' then
  for g in string.gmatch(ARGV[4], '[^\\n]+') do
    redis.call('HSET', ARGV[1] .. 'grp:' .. g, target, '1')
    redis.call('SADD', ARGV[1] .. 'grps:' .. target, g)
  end
end
return target
""",
)

#: KEYS: hashes whose fields are brokers (``grp:<g>`` per group, or ``name:<n>``);
#: ARGV: prefix, self[, stream prefix, kind, channel, frame, maxlen, among]. Every
#: live broker in any of them but this one, once; with the envelope (one Redis),
#: sent to each, and only those it was sent to returned.
FORWARD_EACH: Final = Script(
    "plane_forward_each",
    _SEND
    + """
local seen = {}
local targets = {}
for _, key in ipairs(KEYS) do
  for _, b in ipairs(redis.call('HKEYS', key)) do
    if b ~= ARGV[2] and not seen[b] then
      seen[b] = true
      if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 1 then
        if #ARGV <= 2 or send(ARGV[3], b, ARGV[2], ARGV[4], ARGV[5], ARGV[8], ARGV[6], ARGV[7])
        then targets[#targets + 1] = b end
      end
    end
  end
end
return targets
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

#: KEYS: name:<n>, fwd:<n> (requests forwarded to each broker since it started
#: serving it); ARGV: broker, in flight there, requests it read since it started
#: serving the name. The count becomes what is in flight plus what is on its way,
#: and only while the broker serves the name.
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

#: KEYS: name:<n>; ARGV: broker, how many: that many fewer in flight there, if it
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

#: KEYS: brokers; ARGV: prefix, broker, batch: at most ``batch`` of that broker's
#: directory entries dropped (it leaves, or joins afresh); returns 1 once all are
#: gone, 0 if some are left. Its stream, in another slot, is deleted by the caller.
LEAVE: Final = Script(
    "plane_leave",
    _FORGET
    + """
local _, gone = forget(ARGV[1], ARGV[2], tonumber(ARGV[3]))
if gone then return 1 end
return 0
""",
)

#: KEYS: brokers; ARGV: prefix, batch: at most ``batch`` entries of brokers whose
#: lease ran out forgotten; returns ``{swept, more}``: the identifiers of the
#: brokers gone whole (whose streams, in other slots, the caller deletes) and
#: whether entries are left over for another call.
SWEEP: Final = Script(
    "plane_sweep",
    _FORGET
    + """
local budget = tonumber(ARGV[2])
local swept = {}
for _, b in ipairs(redis.call('SMEMBERS', ARGV[1] .. 'brokers')) do
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. b) == 0 then
    if budget <= 0 then return {swept, 1} end
    local gone
    budget, gone = forget(ARGV[1], b, budget)
    if not gone then return {swept, 1} end
    swept[#swept + 1] = b
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
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
""",
)

#: KEYS: chz, ch, brokers; ARGV: prefix, after ("": from the first), offset, limit.
#: Returns the Channels of live brokers in total (each live broker's ``chs:<b>``),
#: then id, broker pairs: ``offset`` skipped after ``after``, at most ``limit``.
#: ``chz`` holds every id of ``ch`` at score 0, so ZRANGEBYLEX walks them in
#: identifier order from ``after`` and a page reads its own entries, not the
#: whole hash. Entries of dead brokers (not swept yet) are passed over.
CHANNEL_PAGE: Final = Script(
    "plane_channel_page",
    """
local prefix = ARGV[1]
local skip = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local alive = {}
local total = 0
for _, b in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('EXISTS', prefix .. 'alive:' .. b) == 1 then
    alive[b] = true
    total = total + redis.call('SCARD', prefix .. 'chs:' .. b)
  end
end
local out = {total}
local cursor = '-'
if ARGV[2] ~= '' then cursor = '(' .. ARGV[2] end
local chunk = math.max(16, math.min(1000, skip + want))
while #out < 1 + 2 * want do
  local ids = redis.call('ZRANGEBYLEX', KEYS[1], cursor, '+', 'LIMIT', 0, chunk)
  if #ids == 0 then break end
  for _, c in ipairs(ids) do
    local b = redis.call('HGET', KEYS[2], c)
    if b and alive[b] then
      if skip > 0 then
        skip = skip - 1
      elseif #out < 1 + 2 * want then
        out[#out + 1] = c
        out[#out + 1] = b
      end
    end
  end
  cursor = '(' .. ids[#ids]
end
return out
""",
)

SCRIPTS: Final = (
    REPORT,
    DONE,
    FORWARD_CHANNEL,
    FORWARD_EACH,
    SEND_TO,
    LEAVE,
    SWEEP,
    CHANNEL_CLOSED,
    CHANNEL_PAGE,
)
