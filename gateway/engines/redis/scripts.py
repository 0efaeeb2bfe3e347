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
- A lease batch is a member ``<tag>`` of the priority's lease set, scored by
  its deadline in whole milliseconds (``now`` is in seconds: the scripts
  compare leases with ``now * 1000``), and the field ``<priority>:<tag>`` of
  the queue's ``lb`` hash, whose value is the batch's tokens separated by
  spaces: ``<stream id>`` for a first delivery, ``<stream id>:<count>`` for a
  later one (gateway.engines.redis.engine, "Leases"). Integer scores because a
  small sorted set is a listpack, which keeps an integer as one but a fraction
  as text to parse at every step. Each leased entry is also in the consumer
  group's pending list, whose delivery counter is the authority (read back
  with XPENDING after each XCLAIM). The tag is random per fetch call.
- The cost that matters is per message, not per call: a script's loop over
  its messages is kept free of helper calls and tables for the common case
  (a plain message), and each message's data is passed once (ARGV) and
  touched once.
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
    "COPY",
    "DECLARE",
    "DEPTH",
    "ENQUEUE",
    "FETCH",
    "GROUP",
    "LOAD_VIRTUAL_QUEUES",
    "PUBLISH",
    "REGISTER",
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

-- Notices and wake-ups. On one Redis: a classic PUBLISH on the channel named.
-- On a Redis Cluster every key of a queue script opens with its shard's hash
-- tag, KEYS[1] included (asbp:{q<j>}:...): a classic PUBLISH would be repeated
-- to every node (redis/redis#2672), and a script may SPUBLISH only in its own
-- slot, so 'asbp:<rest>' goes out as SPUBLISH on 'asbp:{q<j>}:<rest>', where
-- the engines subscribe (gateway/engines/redis/layout.py, shard_channel).
local function publish(channel, data)
  local shard = string.match(KEYS[1], '^asbp:(%b{}):')
  if shard then
    redis.call('SPUBLISH', 'asbp:' .. shard .. string.sub(channel, 5), data)
  else
    redis.call('PUBLISH', channel, data)
  end
end

local function notice(n, letter, event, queue, now)
  if not n or n == '' then return end
  local spec = cjson.decode(n)
  if string.find(spec[1], letter, 1, true) then
    publish(spec[2], cjson.encode({event, now, queue, spec[3], spec[4]}))
  end
end

local function drop(stream, ids)
  for i = 1, #ids, 1000 do
    local last = math.min(i + 999, #ids)
    redis.call('XACK', stream, GROUP, unpack(ids, i, last))
    redis.call('XDEL', stream, unpack(ids, i, last))
  end
end

-- A lease token's stream id: '<stream id>' on a first delivery, else
-- '<stream id>:<delivery count>' (see "Leases" in the module docstring).
local function token_id(token)
  local colon = string.find(token, ':', 1, true)
  if colon then return string.sub(token, 1, colon - 1) end
  return token
end

-- The tokens of lease batch ``batch`` of priority p, space-separated. A member
-- with no list is a lease from before batches ('<stream id>:<count>:<tag>', one
-- message each), which a Redis may still hold after an upgrade: its one token,
-- so that it comes back when it ends rather than stay pending for ever.
local function batch_tokens(lists, p, batch)
  local listed = redis.call('HGET', lists, p .. ':' .. batch)
  if listed then return listed end
  local id, count = string.match(batch, '^(%d+%-%d+):(%d+):')
  if not id then return '' end
  if count == '1' then return id end
  return id .. ':' .. count
end

-- Stream ids in stream order ('<ms>-<seq>', compared as numbers).
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)')
  local bm, bs = string.match(b, '^(%d+)-(%d+)')
  if am ~= bm then
    if #am ~= #bm then return #am < #bm end
    return am < bm
  end
  return tonumber(as) < tonumber(bs)
end

-- id_less, in one string comparison when both have 13-digit milliseconds (every
-- id until the year 2286) and as long a sequence number.
local function id_before(a, b)
  if #a == #b and string.byte(a, 14) == 45 and string.byte(b, 14) == 45 then return a < b end
  return id_less(a, b)
end

-- Acknowledged entries leave: XACK, then the entries below the oldest one the
-- group still needs go by one XTRIM MINID, which frees whole listpack nodes at
-- once (an XDEL per entry cost Redis seven times as much: bench/queues.py); the
-- others by XDEL. Every entry below the oldest pending one was delivered and is
-- no longer pending, so it was acknowledged or dropped already; with nothing
-- pending, every entry up to the newest acknowledged one is.
local function remove(stream, ids)
  for i = 1, #ids, 1000 do
    redis.call('XACK', stream, GROUP, unpack(ids, i, math.min(i + 999, #ids)))
  end
  local floor = redis.call('XPENDING', stream, GROUP)[2]
  local rest, top = {}, nil
  for _, id in ipairs(ids) do
    if floor then
      if not id_before(id, floor) then rest[#rest + 1] = id end
    elseif not top or id_before(top, id) then
      top = id
    end
  end
  if not floor and top then
    local ms, seq = string.match(top, '^(%d+)-(%d+)$')
    if #seq <= 14 then
      floor = ms .. '-' .. string.format('%d', tonumber(seq) + 1)
    else
      rest = ids  -- too large to add one to exactly: XDEL them all
    end
  end
  if floor then redis.call('XTRIM', stream, 'MINID', floor) end
  for i = 1, #rest, 1000 do
    redis.call('XDEL', stream, unpack(rest, i, math.min(i + 999, #rest)))
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
    publish(channel, '')
  end
end
"""
)


def _script(name: str, body: str) -> Script:
    # BURY: the dead letters' helper (gateway.engines.redis.dead_letters).
    return Script(name, _PRELUDE + BURY + body)


#: Store messages in one queue.
#: KEYS: registry (on a Redis Cluster, any key of the queue's slot), then the
#: queue's block (delayed, waiting, s0..s9), then the expiry index.
#: ARGV: queue, wake channel, max_queues ('' on a cluster: registered already),
#: max_queue_depth, now, then six per
#: message: priority, not_before ('' = none), expiration, header, payload, notice spec.
#: Returns how many it stored, the first ones, as many as max_queue_depth leaves
#: room for; or an error: ``QLIMIT`` (a new queue too many), ``QFULL`` (no room).
ENQUEUE: Final = _script(
    "enqueue",
    """
local queue, now = ARGV[1], ARGV[5]
-- An empty max_queues: a Redis Cluster, where the registry is another slot's and
-- the queue was registered before (REGISTER); KEYS[1] is then a key of this slot.
if ARGV[3] ~= '' and redis.call('SISMEMBER', KEYS[1], queue) == 0 then
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
-- The loop is the script's cost per message: a plain message (not delayed, no
-- notices) is one XADD and one comparison, with no helper called.
for i = 6, 5 + 6 * count, 6 do
  local nb, x, n = ARGV[i + 1], ARGV[i + 2], ARGV[i + 5]
  if nb == '' and n == '' then
    local stream = KEYS[4 + tonumber(ARGV[i])]
    if not made[stream] then ensure_group(stream, made) end
    redis.call('XADD', stream, '*', 'h', ARGV[i + 3], 'p', ARGV[i + 4], 'x', x)
    local t = tonumber(x)
    if not soonest or t < soonest then soonest = t end
  else
    store(2, queue, now, made, tonumber(ARGV[i]), nb, x, ARGV[i + 3], ARGV[i + 4], n)
    soonest = sooner(soonest, nb, x, now)
  end
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

#: Copy topic messages into virtual queues of one shard (a Redis Cluster, where
#: the version check and the publication are calls of their own:
#: gateway.engines.redis.layout). KEYS: one block per virtual queue, then the
#: shard's expiry index. ARGV: now, max_queue_depth, how many messages, then
#: each message's stored form (six values, as PUBLISH's), then two per virtual
#: queue: its full name, its wake channel. A virtual queue takes the messages
#: in order while it has room; those past max_queue_depth get no copy. Returns 1.
COPY: Final = _script(
    "copy",
    """
local now, limit, count = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local first = 4 + 6 * count
local made = {}
for i = first, #ARGV, 2 do
  local b = 1 + (i - first) / 2 * 12
  local queue = ARGV[i]
  local room = math.min(count, limit - depth(b))
  if room > 0 then
    promote(b, queue, now, made, 1000)
    local soonest = nil
    for m = 4, 3 + 6 * room, 6 do
      local nb, x = ARGV[m + 1], ARGV[m + 2]
      store(b, queue, now, made, tonumber(ARGV[m]), nb, x, ARGV[m + 3], ARGV[m + 4], ARGV[m + 5])
      soonest = sooner(soonest, nb, x, now)
    end
    redis.call('ZADD', KEYS[#KEYS], 'LT', soonest, queue)
    wake(b, ARGV[i + 1])
  end
end
return 1
""",
)

#: Register a queue (a Redis Cluster, where ENQUEUE cannot: the registry is
#: another slot's). KEYS: registry. ARGV: queue, max_queues. Returns 1 if new,
#: 0 if known; error QLIMIT.
REGISTER: Final = _script(
    "register",
    """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return redis.error_reply('QLIMIT ' .. ARGV[1])
end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
""",
)

#: Lease up to ``count`` messages of one queue.
#: KEYS: the queue's block (delayed, waiting, s0..s9), then l0..l9, then the
#: lease lists (lb).
#: ARGV: queue, consumer, count, now, deadline (whole milliseconds), max_deliveries, arm ('1': set
#: the waiting flag if nothing is deliverable), budget (entries examined at
#: most), lease tag.
#: Returns {more, next, then groups: p, delivery count, n, then n times id,
#: header, payload}: ``more`` is 1 when the budget ran out (call again), ``next``
#: the earliest time something may become deliverable ('' if none) when nothing
#: was leased. Groups, not five values per message: what the script returns, it
#: converts per value, and the engine parses per value.
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
local tag = ARGV[9]
local lists = KEYS[23]
local out = {0, ''}
local made = {}

-- Delayed messages that are due join their streams first.
budget = budget - promote(1, queue, now_s, made, budget)

-- Leases past their deadline come back before new messages of their priority,
-- by deadline, then in stream order, whichever batches they were leased in.
-- ``pieces`` collects this call's lease list for priority p: its tokens.
local function reclaim(p, pieces)
  local stream, leases = KEYS[3 + p], KEYS[13 + p]
  if remaining <= 0 or budget <= 0 then return end
  local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', now_ms, 'WITHSCORES',
                           'LIMIT', 0, budget)
  if #ended == 0 then return end
  -- The batches ended first, as many as this call may take, and with them any
  -- that ended in the same millisecond as the last one (their order is by stream
  -- id). Each batch's list is in stream order already (take and reclaim append in
  -- order, release sorts): only tokens from several batches need sorting.
  local tokens = {}  -- {deadline, token, stream id}
  local batches = 0
  for k = 1, #ended, 2 do
    local batch, score = ended[k], tonumber(ended[k + 1])
    if #tokens >= budget then break end  -- the later batches wait for the next call
    if #tokens >= remaining and tokens[#tokens][1] ~= score then break end
    batches = batches + 1
    for token in string.gmatch(batch_tokens(lists, p, batch), '[^ ]+') do
      tokens[#tokens + 1] = {score, token, token_id(token)}
    end
    redis.call('ZREM', leases, batch)
    redis.call('HDEL', lists, p .. ':' .. batch)
  end
  if batches > 1 then
    table.sort(tokens, function(a, b)
      if a[1] ~= b[1] then return a[1] < b[1] end
      return id_before(a[3], b[3])
    end)
  end
  local left, left_score = {}, nil
  for _, item in ipairs(tokens) do
    local token = item[2]
    if remaining <= 0 or budget <= 0 then
      left[#left + 1] = token
      left_score = left_score or item[1]
    else
      budget = budget - 1
      local id = item[3]
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
          pieces[#pieces + 1] = id .. ':' .. count  -- count >= 2 here
          local n = #out
          out[n + 1], out[n + 2], out[n + 3] = p, count, 1  -- a group of one
          out[n + 4], out[n + 5], out[n + 6] = id, f[2], f[4]
          remaining = remaining - 1
        end
      end
    end
  end
  if #left > 0 then
    -- What this call had no room for stays ended, first in line for the next
    -- one, in a batch no receipt can name (':' is not in a receipt's tag).
    local batch = tag .. ':x'
    redis.call('ZADD', leases, left_score, batch)
    redis.call('HSET', lists, p .. ':' .. batch, table.concat(left, ' '))
  end
end

local function take(p, pieces)
  local stream = KEYS[3 + p]
  if redis.call('EXISTS', stream) == 0 then return end
  while remaining > 0 and budget > 0 do
    local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer,
                            'COUNT', math.min(remaining, budget), 'STREAMS', stream, '>')
    if not read then return end
    local entries = read[1][2]
    if #entries == 0 then return end
    budget = budget - #entries
    local expired = {}
    -- One group for the read: priority, delivery count 1, how many, then each.
    local size = #out + 3
    out[size - 2], out[size - 1], out[size] = p, 1, 0
    local n, k = size, #pieces
    for _, entry in ipairs(entries) do
      local id, f = entry[1], entry[2]
      if tonumber(f[6]) <= now then
        expired[#expired + 1] = id
        notice(f[8], 'X', 'expired', queue, now_s)
      else
        k = k + 1
        pieces[k] = id
        out[n + 1], out[n + 2], out[n + 3] = id, f[2], f[4]
        n = n + 3
      end
    end
    out[size] = (n - size) / 3
    remaining = remaining - out[size]
    if #expired > 0 then drop(stream, expired) end
  end
end

for p = 9, 0, -1 do
  if remaining == 0 or budget <= 0 then break end
  local pieces = {}
  reclaim(p, pieces)
  take(p, pieces)
  -- One lease for everything this call leased at priority p: one sorted-set
  -- member and one list, however many messages.
  if #pieces > 0 then
    redis.call('ZADD', KEYS[13 + p], deadline, tag)
    redis.call('HSET', lists, p .. ':' .. tag, table.concat(pieces, ' '))
  end
end
if budget <= 0 and remaining > 0 then out[1] = 1 end

if remaining == tonumber(ARGV[3]) and out[1] == 0 then
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
-- KEYS: the queue's block (delayed, waiting, s0..s9), then l0..l9, then the
-- lease lists (lb).
-- ARGV: queue, now, then (from FIRST) the receipts in groups, one per batch (the
-- engine groups them: gateway.engines.redis.calls.LeasesCall): the head (the
-- priority digit, followed by 'n' when the messages have notice specs), the
-- batch (the tag of the fetch call that leased them), how many receipts, then
-- each receipt's token ('<stream id>', or '<stream id>:<count>' after the first
-- delivery, as the batch's list holds them).
-- Returns one 0/1 per receipt, in the order given.
local queue, now_s = ARGV[1], ARGV[2]
local now_ms = tonumber(now_s) * 1000  -- leases are scored in milliseconds
local lists = KEYS[23]
local out = {}
local live = {}  -- live[p] = {{tokens, noticed, batch}, ...}: what each group ended
local i = FIRST
while i <= #ARGV do
  local head, batch = ARGV[i], ARGV[i + 1]
  local first = i + 3
  i = first + tonumber(ARGV[i + 2])
  local p = tonumber(string.sub(head, 1, 1))
  local field = p .. ':' .. batch
  local score = redis.call('ZSCORE', KEYS[13 + p], batch)
  local listed = score and tonumber(score) > now_ms and redis.call('HGET', lists, field)
  local given = listed and {unpack(ARGV, first, i - 1)}
  local joined = given and table.concat(given, ' ')
  if not listed then
    for _ = first, i - 1 do out[#out + 1] = 0 end
  elseif string.sub(listed, 1, #joined) == joined
      and (#joined == #listed or string.byte(listed, #joined + 1) == 32) then
    -- The receipts are the batch's first tokens, in its order (a consumer
    -- acknowledging as it was served): all live, and what is left is the rest
    -- of the list, with no token looked at one by one.
    for _ = first, i - 1 do out[#out + 1] = 1 end
    if #joined == #listed then
      redis.call('ZREM', KEYS[13 + p], batch)
      redis.call('HDEL', lists, field)
    else
      redis.call('HSET', lists, field, string.sub(listed, #joined + 2))
    end
    live[p] = live[p] or {}
    table.insert(live[p], {given, #head > 1, batch})
  else
    local held, size = {}, 0
    for token in string.gmatch(listed, '[^ ]+') do
      held[token] = true
      size = size + 1
    end
    local ended = {}
    for j = first, i - 1 do
      local token = ARGV[j]
      if held[token] then
        held[token] = false  -- a receipt given twice is live once: the first time
        ended[#ended + 1] = token
        out[#out + 1] = 1
      else
        out[#out + 1] = 0
      end
    end
    if #ended == size then
      redis.call('ZREM', KEYS[13 + p], batch)
      redis.call('HDEL', lists, field)
    elseif #ended > 0 then
      local left = {}
      for token in string.gmatch(listed, '[^ ]+') do
        if held[token] then left[#left + 1] = token end
      end
      redis.call('HSET', lists, field, table.concat(left, ' '))
    end
    if #ended > 0 then
      live[p] = live[p] or {}
      table.insert(live[p], {ended, #head > 1, batch})
    end
  end
end

-- A token's stream id and delivery count.
local function parse(token)
  local colon = string.find(token, ':', 1, true)
  if not colon then return token, 1 end
  return string.sub(token, 1, colon - 1), tonumber(string.sub(token, colon + 1))
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
for p, groups in pairs(live) do
  local stream, ids = KEYS[3 + p], {}
  for _, group in ipairs(groups) do
    for _, token in ipairs(group[1]) do
      local id = parse(token)
      if group[2] then notice_for(stream, id, 'consumed') end
      ids[#ids + 1] = id
    end
  end
  remove(stream, ids)
end
return out
""",
)

#: End leases without acknowledging. ARGV as ACK's, with max_deliveries and
#: the wake channel third and fourth (the receipts start at the fifth); KEYS as
#: ACK's, then the expiry index. A lease that was the max_deliveries-th delivery
#: ends the message (DISCARDED). The others move to the batch ``<tag>:r`` (a
#: name no receipt can carry) scored 0: past every deadline, so the next fetch
#: reclaims them first.
RELEASE: Final = _script(
    "release",
    """
local FIRST = 5
local max_deliveries, channel = tonumber(ARGV[3]), ARGV[4]
"""
    + _LIVE_LEASES
    + """
local woken = false
for p, groups in pairs(live) do
  local stream = KEYS[3 + p]
  local released = {}  -- batch -> tokens
  for _, group in ipairs(groups) do
    for _, token in ipairs(group[1]) do
      local id, count = parse(token)
      if count >= max_deliveries then
        if group[2] then notice_for(stream, id, 'discarded') end
        bury(stream, id, count)
      else
        local batch = group[3] .. ':r'
        released[batch] = released[batch] or {}
        table.insert(released[batch], token)
        woken = true
      end
    end
  end
  for batch, tokens in pairs(released) do
    -- In stream order, as every list is (reclaim relies on it).
    local field = p .. ':' .. batch
    for token in string.gmatch(redis.call('HGET', lists, field) or '', '[^ ]+') do
      tokens[#tokens + 1] = token
    end
    local ids = {}
    for _, token in ipairs(tokens) do ids[token] = token_id(token) end
    table.sort(tokens, function(a, b) return id_before(ids[a], ids[b]) end)
    redis.call('HSET', lists, field, table.concat(tokens, ' '))
    redis.call('ZADD', KEYS[13 + p], 0, batch)
  end
end
if woken then
  wake(1, channel)
  -- Released messages may expire before the queue's time in the index: look soon.
  redis.call('ZADD', KEYS[24], 'LT', now_s, queue)
end
return out
""",
)

#: Remove one queue's expired messages no fetch is about to meet, and compute its next
#: sweep (gateway.engines.redis.expiry). KEYS: the expiry index, the queue's block
#: (delayed, waiting, s0..s9), l0..l9, the lease lists. ARGV: queue, now, budget
#: (entries examined at most).
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
  -- Ended leases: an expired message leaves; another waits for a fetch until it
  -- expires. A batch is looked at whole (at most MAX_FETCH entries).
  local ended = redis.call('ZRANGEBYSCORE', leases, '-inf', now_ms, 'LIMIT', 0, budget)
  for _, batch in ipairs(ended) do
    if budget <= 0 then break end
    budget = budget - 1
    local field = p .. ':' .. batch
    local left = {}
    for token in string.gmatch(batch_tokens(KEYS[24], p, batch), '[^ ]+') do
      budget = budget - 1
      local id = token_id(token)
      local entry = redis.call('XRANGE', stream, id, id)[1]
      if not entry then
        -- Its message is gone already: the token goes too.
      elseif tonumber(entry[2][6]) <= now then
        drop(stream, {id})
        notice(entry[2][8], 'X', 'expired', queue, now_s)
        removed = removed + 1
      else
        soon(entry[2][6])
        left[#left + 1] = token
      end
    end
    if #left == 0 then
      redis.call('ZREM', leases, batch)
      redis.call('HDEL', KEYS[24], field)
    else
      redis.call('HSET', KEYS[24], field, table.concat(left, ' '))
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
    COPY,
    REGISTER,
    FETCH,
    ACK,
    RELEASE,
    SWEEP,
    DECLARE,
    LOAD_VIRTUAL_QUEUES,
    DEPTH,
    REQUEUE_DEAD,
)
