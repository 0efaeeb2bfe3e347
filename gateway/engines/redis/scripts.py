"""The Lua scripts of the Redis engine: every queue operation is one script call.

A script runs atomically in Redis, so a queue operation never leaves a half-done
state behind (a message read but not leased, acknowledged but not deleted), and
it costs one command however many messages it touches. That is why
``fetch(count=100)`` is one round trip, and why concurrent ``enqueue`` calls on
one queue become one script call (:mod:`gateway.engines.redis.batch`).

The key layout and the stream entry format are in :mod:`gateway.engines.redis.engine`.
Conventions the scripts share:

- Times come from the engine's clock, as decimal strings in ARGV (``now``,
  ``deadline``), never from Redis's own clock: a broker's clock is the one its
  ``Delivery.deadline`` promises, and tests inject a fake one.
- A stream entry's fields are always written in the order ``h p x`` then,
  only for a message with delivery notices, ``n``; the scripts read them by
  position (``f[2]`` header, ``f[4]`` payload, ``f[6]`` expiration, ``f[8]``
  notice spec).
- A lease is a member ``<stream id>:<delivery count>:<tag>`` of the
  priority's lease set, scored by its deadline in whole milliseconds (``now``
  is in seconds: the scripts compare leases with ``now * 1000``). Integer
  scores because a small sorted set is a listpack, which a ZADD, ZMSCORE or
  ZRANGEBYSCORE walks element by element, and which keeps an integer as one
  but a fraction as text to parse at every step: a fetch's ZADD of 100 leases
  cost 3-4 times as much with seconds as fractions. The same entry is in the
  consumer group's pending list, whose delivery counter is the authority (read
  back with XPENDING after each XCLAIM). The tag is random per fetch call: two
  queues' streams can hold the same id, and their leases must differ.
- The notice spec ``n`` is the JSON ``[flags, channel, message id, notify]``:
  ``flags`` holds ``Q`` when QUEUED was asked for and ``X`` when the DEQUEUED
  events were; ``channel`` is the publishing broker's notice channel.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

from gateway.engines.redis.dead_letters import BURY, REQUEUE

__all__ = [
    "ACK",
    "DECLARE",
    "DEPTH",
    "ENQUEUE",
    "FETCH",
    "GROUP",
    "LOAD_VIRTUAL_QUEUES",
    "PUBLISH",
    "RELEASE",
    "REQUEUE_DEAD",
    "SCRIPTS",
    "SWEEP",
    "Script",
]

#: The consumer group on every priority stream.
GROUP: Final = "asbp"


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script, called by its SHA-1 (EVALSHA) and loaded on NOSCRIPT."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# Helpers every script may use. A queue's keys come as a *block* in KEYS:
# delayed set, waiting flag, streams s0..s9; ``b`` is the index of its first.
_PRELUDE: Final = (
    """
local GROUP = '"""
    + GROUP
    + """'

local function notice(n, letter, event, queue, now)
  if not n or n == '' then return end
  local spec = cjson.decode(n)
  if string.find(spec[1], letter, 1, true) then
    redis.call('PUBLISH', spec[2], cjson.encode({event, now, queue, spec[3], spec[4]}))
  end
end

local function drop(stream, ids)
  for i = 1, #ids, 1000 do
    local last = math.min(i + 999, #ids)
    redis.call('XACK', stream, GROUP, unpack(ids, i, last))
    redis.call('XDEL', stream, unpack(ids, i, last))
  end
end

local function ensure_group(stream, made)
  if made[stream] then return end
  if redis.call('EXISTS', stream) == 0 then
    redis.call('XGROUP', 'CREATE', stream, GROUP, '0', 'MKSTREAM')
  end
  made[stream] = true
end

local function append(stream, h, payload, x, n)
  if n == '' then
    redis.call('XADD', stream, '*', 'h', h, 'p', payload, 'x', x)
  else
    redis.call('XADD', stream, '*', 'h', h, 'p', payload, 'x', x, 'n', n)
  end
end

local function depth(b)
  local total = redis.call('ZCARD', KEYS[b])
  for p = 0, 9 do total = total + redis.call('XLEN', KEYS[b + 2 + p]) end
  return total
end

-- Move up to ``limit`` due delayed messages of the queue at KEYS[b] into their
-- streams, in due order: "as though received at the specified time" (DCE,
-- "Timed Dequeuing"), so before anything stored after that time. Expired ones
-- leave instead. Returns how many were looked at.
local function promote(b, queue, now_s, made, limit)
  local due = redis.call('ZRANGEBYSCORE', KEYS[b], '-inf', now_s, 'LIMIT', 0, limit)
  if #due == 0 then return 0 end
  redis.call('ZREM', KEYS[b], unpack(due))
  local now = tonumber(now_s)
  for _, member in ipairs(due) do
    local m = cmsgpack.unpack(member)  -- {p, x, h, payload, n}
    if tonumber(m[2]) <= now then
      notice(m[5], 'X', 'expired', queue, now_s)
    else
      local stream = KEYS[b + 2 + m[1]]
      ensure_group(stream, made)
      append(stream, m[3], m[4], m[2], m[5])
    end
  end
  return #due
end

-- Store one message in the queue whose keys start at KEYS[b] (call promote first).
local function store(b, queue, now, made, p, nb, x, h, payload, n)
  if nb ~= '' and tonumber(nb) > tonumber(now) then
    redis.call('ZADD', KEYS[b], nb, cmsgpack.pack({p, x, h, payload, n}))
  else
    local stream = KEYS[b + 2 + p]
    ensure_group(stream, made)
    append(stream, h, payload, x, n)
  end
  notice(n, 'Q', 'queued', queue, now)
end

-- The earlier of ``soonest`` and when a message just stored needs the sweep:
-- its expiration, or when it is due if it is delayed (promote expires it then).
local function sooner(soonest, nb, x, now)
  local t = tonumber(x)
  if nb ~= '' and tonumber(nb) > tonumber(now) then t = tonumber(nb) end
  if not soonest or t < soonest then return t end
  return soonest
end

-- Tell consumers waiting on the queue (any broker) that something changed.
local function wake(b, channel)
  if redis.call('EXISTS', KEYS[b + 1]) == 1 then
    redis.call('DEL', KEYS[b + 1])
    redis.call('PUBLISH', channel, '')
  end
end
"""
)


def _script(name: str, body: str) -> Script:
    # BURY: the dead letters' helper (gateway.engines.redis.dead_letters).
    return Script(name, _PRELUDE + BURY + body)


#: Store messages in one queue.
#: KEYS: registry, then the queue's block (delayed, waiting, s0..s9), then the
#: expiry index.
#: ARGV: queue, wake channel, max_queues, max_queue_depth, now, then six per
#: message: priority, not_before ('' = none), expiration, header, payload, notice spec.
#: Returns how many it stored, the first ones, as many as max_queue_depth leaves
#: room for; or an error: ``QLIMIT`` (a new queue too many), ``QFULL`` (no room).
ENQUEUE: Final = _script(
    "enqueue",
    """
local queue, now = ARGV[1], ARGV[5]
if redis.call('SISMEMBER', KEYS[1], queue) == 0 then
  if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return redis.error_reply('QLIMIT ' .. queue)
  end
  redis.call('SADD', KEYS[1], queue)
end
local made = {}
promote(2, queue, now, made, 1000)
local room = tonumber(ARGV[4]) - depth(2)
if room <= 0 then return redis.error_reply('QFULL ' .. queue) end
local count = math.min((#ARGV - 5) / 6, room)
local soonest = nil
for i = 6, 5 + 6 * count, 6 do
  store(2, queue, now, made, tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
        ARGV[i + 4], ARGV[i + 5])
  soonest = sooner(soonest, ARGV[i + 1], ARGV[i + 2], now)
end
if soonest then redis.call('ZADD', KEYS[14], 'LT', soonest, queue) end
wake(2, ARGV[2])
return count
""",
)

#: Publish a topic message and copy it into matching virtual queues.
#: KEYS: the virtual-queue version counter, then one block per virtual queue,
#: then the expiry index.
#: ARGV: cached version, topic channel, origin tag + header as published, now,
#: max_queue_depth, then the stored form (priority, not_before, expiration,
#: header, payload, notice spec), then two per virtual queue: its full name,
#: its wake channel. A full virtual queue gets no copy.
#: Returns 0 (nothing done) when the cached version is stale, else 1.
PUBLISH: Final = _script(
    "publish",
    """
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return 0 end
local h, payload = ARGV[9], ARGV[10]
redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\\n' .. payload)
local made, limit = {}, tonumber(ARGV[5])
for i = 12, #ARGV, 2 do
  local b = 2 + (i - 12) / 2 * 12
  if depth(b) < limit then
    promote(b, ARGV[i], ARGV[4], made, 1000)
    store(b, ARGV[i], ARGV[4], made, tonumber(ARGV[6]), ARGV[7], ARGV[8], h, payload, ARGV[11])
    redis.call('ZADD', KEYS[#KEYS], 'LT', sooner(nil, ARGV[7], ARGV[8], ARGV[4]), ARGV[i])
    wake(b, ARGV[i + 1])
  end
end
return 1
""",
)

#: Lease up to ``count`` messages of one queue.
#: KEYS: the queue's block (delayed, waiting, s0..s9), then l0..l9.
#: ARGV: queue, consumer, count, now, deadline (whole milliseconds), max_deliveries, arm ('1': set
#: the waiting flag if nothing is deliverable), budget (entries examined at
#: most), lease tag.
#: Returns {more, next, p, id, count, header, payload, ...}: ``more`` is 1 when
#: the budget ran out (call again), ``next`` the earliest time something may
#: become deliverable ('' if none) when nothing was leased.
FETCH: Final = _script(
    "fetch",
    """
local queue, consumer = ARGV[1], ARGV[2]
local remaining = tonumber(ARGV[3])
local now_s, deadline = ARGV[4], ARGV[5]
local now = tonumber(now_s)
local now_ms = string.format('%.6f', now * 1000)  -- leases are scored in milliseconds
local max_deliveries = tonumber(ARGV[6])
local budget = tonumber(ARGV[8])
local tag = ':' .. ARGV[9]
local out = {0, ''}
local made = {}

-- Delayed messages that are due join their streams first.
budget = budget - promote(1, queue, now_s, made, budget)

-- Leases past their deadline come back before new messages of their priority.
local function reclaim(p)
  local stream, leases = KEYS[3 + p], KEYS[13 + p]
  while remaining > 0 and budget > 0 do
    local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', now_ms, 'LIMIT', 0,
                             math.min(remaining, budget))
    if #ended == 0 then return end
    redis.call('ZREM', leases, unpack(ended))
    budget = budget - #ended
    for _, member in ipairs(ended) do
      local id = string.sub(member, 1, string.find(member, ':', 1, true) - 1)
      -- XCLAIM returns the entry and adds one to the pending list's delivery
      -- counter, which is the authority for delivery_count.
      local entry = redis.call('XCLAIM', stream, GROUP, consumer, 0, id)[1]
      if entry and entry[2] then
        local f = entry[2]
        local count = redis.call('XPENDING', stream, GROUP, id, id, 1)[1][4]
        if count > max_deliveries then
          bury(stream, id, count - 1)
          notice(f[8], 'X', 'discarded', queue, now_s)
        elseif tonumber(f[6]) <= now then
          drop(stream, {id})
          notice(f[8], 'X', 'expired', queue, now_s)
        else
          redis.call('ZADD', leases, deadline, id .. ':' .. count .. tag)
          out[#out + 1] = p
          out[#out + 1] = id
          out[#out + 1] = count
          out[#out + 1] = f[2]
          out[#out + 1] = f[4]
          remaining = remaining - 1
        end
      end
    end
  end
end

local function take(p)
  local stream, leases = KEYS[3 + p], KEYS[13 + p]
  if redis.call('EXISTS', stream) == 0 then return end
  while remaining > 0 and budget > 0 do
    local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer,
                            'COUNT', math.min(remaining, budget), 'STREAMS', stream, '>')
    if not read then return end
    local entries = read[1][2]
    if #entries == 0 then return end
    budget = budget - #entries
    local leased, expired = {}, {}
    for _, entry in ipairs(entries) do
      local id, f = entry[1], entry[2]
      if tonumber(f[6]) <= now then
        expired[#expired + 1] = id
        notice(f[8], 'X', 'expired', queue, now_s)
      else
        leased[#leased + 1] = deadline
        leased[#leased + 1] = id .. ':1' .. tag
        out[#out + 1] = p
        out[#out + 1] = id
        out[#out + 1] = 1
        out[#out + 1] = f[2]
        out[#out + 1] = f[4]
        remaining = remaining - 1
      end
    end
    if #expired > 0 then drop(stream, expired) end
    for i = 1, #leased, 1000 do
      redis.call('ZADD', leases, unpack(leased, i, math.min(i + 999, #leased)))
    end
  end
end

for p = 9, 0, -1 do
  if remaining == 0 or budget <= 0 then break end
  reclaim(p)
  take(p)
end
if budget <= 0 and remaining > 0 then out[1] = 1 end

if #out == 2 and out[1] == 0 then
  local next_s, next_n = nil, nil
  local function consider(key, scale)
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then
      local t = tonumber(first[2]) / scale
      if not next_n or t < next_n then
        next_s, next_n = string.format('%.3f', t), t
        if scale == 1 then next_s = first[2] end
      end
    end
  end
  consider(KEYS[1], 1)
  for p = 0, 9 do consider(KEYS[13 + p], 1000) end
  if next_s then out[2] = next_s end
  if ARGV[7] == '1' then redis.call('SET', KEYS[2], '1') end
end
return out
""",
)

# Shared by ACK and RELEASE: find the live leases among the receipts.
_LIVE_LEASES: Final = """
-- KEYS: the queue's block (delayed, waiting, s0..s9), then l0..l9.
-- ARGV: queue, now, then (from FIRST) two per receipt, the receipt split at its
-- first ':' (checked by the engine): the priority digit, followed by 'n' when
-- the message has a notice spec; then the lease, '<stream id>:<count>:<tag>'.
-- Returns one 0/1 per receipt.
local queue, now_s = ARGV[1], ARGV[2]
local now = tonumber(now_s)
local now_ms = now * 1000  -- leases are scored in milliseconds
local out = {}
local live = {}  -- live[p] = {{id, count, noticed, lease}, ...}
-- The receipts by priority, in order: one ZMSCORE and one ZREM per priority,
-- rather than a ZSCORE and a ZREM per receipt (the largest part of an ack).
local asked = {}  -- asked[p] = {{lease, ...}, {place in out, ...}, {head, ...}}
for i = FIRST, #ARGV, 2 do
  local place = #out + 1
  out[place] = 0
  local head = ARGV[i]
  local p = tonumber(string.sub(head, 1, 1))
  local group = asked[p]
  if not group then
    group = {{}, {}, {}}
    asked[p] = group
  end
  local k = #group[1] + 1
  group[1][k], group[2][k], group[3][k] = ARGV[i + 1], place, head
end
for p, group in pairs(asked) do
  local members, places, heads = group[1], group[2], group[3]
  local scores = redis.call('ZMSCORE', KEYS[13 + p], unpack(members))
  local taken, ended = {}, {}
  for k, member in ipairs(members) do
    local score = scores[k]
    -- A receipt given twice is live once: the first time.
    if score and not taken[member] and tonumber(score) > now_ms then
      taken[member] = true
      ended[#ended + 1] = member
      local first = string.find(member, ':', 1, true)
      local second = string.find(member, ':', first + 1, true)
      live[p] = live[p] or {}
      table.insert(live[p], {string.sub(member, 1, first - 1),
                             tonumber(string.sub(member, first + 1, second - 1)),
                             #heads[k] > 1, member})
      out[places[k]] = 1
    end
  end
  if #ended > 0 then redis.call('ZREM', KEYS[13 + p], unpack(ended)) end
end

local function notice_for(stream, id, event)
  local entry = redis.call('XRANGE', stream, id, id)[1]
  if entry then notice(entry[2][8], 'X', event, queue, now_s) end
end
"""

#: Acknowledge leases: their messages leave the queue.
ACK: Final = _script(
    "ack",
    "local FIRST = 3\n"
    + _LIVE_LEASES
    + """
for p, leases in pairs(live) do
  local stream, ids = KEYS[3 + p], {}
  for _, lease in ipairs(leases) do
    if lease[3] then notice_for(stream, lease[1], 'consumed') end
    ids[#ids + 1] = lease[1]
  end
  drop(stream, ids)
end
return out
""",
)

#: End leases without acknowledging. ARGV as ACK's, with max_deliveries and
#: the wake channel third and fourth (the receipts start at the fifth); KEYS as
#: ACK's, then the expiry index. A lease that was the max_deliveries-th delivery
#: ends the message (DISCARDED).
RELEASE: Final = _script(
    "release",
    """
local FIRST = 5
local max_deliveries, channel = tonumber(ARGV[3]), ARGV[4]
"""
    + _LIVE_LEASES
    + """
local woken = false
for p, leases in pairs(live) do
  local stream = KEYS[3 + p]
  for _, lease in ipairs(leases) do
    if lease[2] >= max_deliveries then
      if lease[3] then notice_for(stream, lease[1], 'discarded') end
      bury(stream, lease[1], lease[2])
    else
      -- Score 0: past every deadline, so the next fetch reclaims it first.
      redis.call('ZADD', KEYS[13 + p], 0, lease[4])
      woken = true
    end
  end
end
if woken then
  wake(1, channel)
  -- Released messages may expire before the queue's time in the index: look soon.
  redis.call('ZADD', KEYS[23], 'LT', now_s, queue)
end
return out
""",
)

#: Remove one queue's expired messages no fetch is about to meet, and compute its next
#: sweep (gateway.engines.redis.expiry). KEYS: the expiry index, the queue's block
#: (delayed, waiting, s0..s9), l0..l9. ARGV: queue, now, budget (entries examined at most).
#: Returns {removed, more}: ``more`` is 1 when the budget ran out.
SWEEP: Final = _script(
    "sweep",
    """
local queue, now_s = ARGV[1], ARGV[2]
local now = tonumber(now_s)
local now_ms = string.format('%.6f', now * 1000)  -- leases are scored in milliseconds
local budget = tonumber(ARGV[3])
local removed, next_n = 0, nil
local function soon(t)
  t = tonumber(t)
  if t and (not next_n or t < next_n) then next_n = t end
end
local function delete(stream, ids)
  for i = 1, #ids, 1000 do
    redis.call('XDEL', stream, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- Due delayed messages join their streams, or leave if they expired.
budget = budget - promote(2, queue, now_s, {}, budget)
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
soon(first[2])

for p = 0, 9 do
  if budget <= 0 then break end
  local stream, leases = KEYS[4 + p], KEYS[14 + p]
  -- Ended leases: an expired message leaves; another waits for a fetch until it expires.
  local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', now_ms, 'LIMIT', 0, budget)
  budget = budget - #ended
  for _, member in ipairs(ended) do
    local id = string.sub(member, 1, string.find(member, ':', 1, true) - 1)
    local entry = redis.call('XRANGE', stream, id, id)[1]
    if not entry then
      redis.call('ZREM', leases, member)  -- its message is gone already
    elseif tonumber(entry[2][6]) <= now then
      redis.call('ZREM', leases, member)
      drop(stream, {id})
      notice(entry[2][8], 'X', 'expired', queue, now_s)
      removed = removed + 1
    else
      soon(entry[2][6])
    end
  end
  -- Live leases: the lease decides until it ends.
  local live = redis.call('ZRANGEBYSCORE', leases, '(' .. now_ms, '+inf', 'LIMIT', 0, 1,
                          'WITHSCORES')
  if live[2] then soon(tonumber(live[2]) / 1000) end
  -- Entries no consumer has read yet: after the group's last delivered id.
  if budget > 0 and redis.call('EXISTS', stream) == 1 then
    local last = '0-0'
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local fields = {}
      for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
      if fields['name'] == GROUP then last = fields['last-delivered-id'] end
    end
    local entries = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', budget)
    budget = budget - #entries
    local expired = {}
    for _, entry in ipairs(entries) do
      local f = entry[2]
      if tonumber(f[6]) <= now then
        expired[#expired + 1] = entry[1]
        notice(f[8], 'X', 'expired', queue, now_s)
      else
        soon(f[6])
      end
    end
    delete(stream, expired)
    removed = removed + #expired
  end
end

if budget <= 0 then
  redis.call('ZADD', KEYS[1], now_s, queue)  -- not done: again at the next sweep
  return {removed, 1}
end
if next_n then
  redis.call('ZADD', KEYS[1], next_n, queue)
else
  redis.call('ZREM', KEYS[1], queue)  -- nothing left that could expire
end
return {removed, 0}
""",
)

#: Declare a virtual queue. KEYS: registry, virtual-queue hash, version counter.
#: ARGV: full name, pattern, max_queues. Returns 1 if new, 0 if known; error QLIMIT.
DECLARE: Final = _script(
    "declare",
    """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return redis.error_reply('QLIMIT ' .. ARGV[1])
  end
  redis.call('SADD', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('INCR', KEYS[3])
return 1
""",
)

#: The version counter and every virtual queue, read together.
#: KEYS: version counter, virtual-queue hash. Returns {version, {name, pattern, ...}}.
LOAD_VIRTUAL_QUEUES: Final = _script(
    "load_virtual_queues",
    """
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2])}
""",
)

#: Messages in one queue. KEYS: the queue's block.
DEPTH: Final = _script("depth", "return depth(1)\n")

#: Move dead letters back (gateway.engines.redis.dead_letters).
REQUEUE_DEAD: Final = _script("requeue_dead", REQUEUE)

#: Every script, for SCRIPT LOAD.
SCRIPTS: Final = (
    ENQUEUE,
    PUBLISH,
    FETCH,
    ACK,
    RELEASE,
    SWEEP,
    DECLARE,
    LOAD_VIRTUAL_QUEUES,
    DEPTH,
    REQUEUE_DEAD,
)
