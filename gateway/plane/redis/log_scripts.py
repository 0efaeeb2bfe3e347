"""The Lua scripts of the Channel log on Redis: each operation is one atomic script call.

Keys per Channel ``<i>`` (hash-tagged on ``i`` so that they share a slot):

- ``<prefix>log:{<i>}``: a hash. ``h`` the digest of the Channel's secret,
  ``x`` the idle expiry and ``s`` the last use (milliseconds), ``n`` the
  newest number, ``a`` acknowledged through, ``l`` the newest number dropped
  unacknowledged (the gap), ``b`` the bytes the stream holds, ``c`` the
  bytes ever appended (each entry's ``c``: see below), ``w`` the
  broker holding a resumable WebSocket Channel's log (LOG_HOLD), if one does,
  ``wp`` the ID of the last entry forwarded to that broker's inbound stream for
  the Channel while it held the log, ``v`` the broker that released it last
  (LOG_RELEASE) while frames forwarded to it may still be unread there: the
  *release barrier*, lifted by that broker once it has handled them
  (LOG_SETTLED), passed over once it is dead (LOG_PENDING salvages them).
  On a Redis Cluster, where the send to the holder is a call of its own in its
  stream's slot, ``q`` counts the frames routed to the holder since it took
  the log (LOG_OR_HOLDER) instead of ``wp``, and its release puts up the
  barrier until its reader has read that many (LOG_RELEASE_COUNTED,
  gateway.plane.redis.counted_barriers).
- ``<prefix>logv:{<i>}``: a list, the frames routed to the Channel by other
  brokers while the barrier is up, held back so that they go into the log after
  the ones the barrier's broker passes on (gateway.plane.redis.release_barriers);
  appended when it lifts.
- ``<prefix>logs:{<i>}``: the stream. Entry ``0-<n>`` is Command number
  ``n``: fields ``f`` (the frame), ``t`` (when appended, ms) and ``c`` (the
  bytes appended to the log through this frame: the hash's ``c`` then, so
  that retention knows the bytes it leaves without reading what it drops;
  absent in logs written before it). Explicit ids
  make the stream's order the numbers' order, and a read after ``n`` one
  XRANGE from ``0-<n+1>``.
- ``<prefix>logw:{<i>}``: the brokers with a reader parked on the log. An
  append XADDs a wake-up (``k=w``) to each one's inbound stream, which its
  plane reads with XREAD BLOCK already, and empties the set: a woken reader
  reads again and parks again if it must.

Brokers' inbound streams and leases are named as gateway/plane/redis/keys.py
names them (``{<prefix>in:<b>}``, ``{<prefix>}alive:<b>``). A wake-up or a
forward touches another broker's stream from the log's slot, so on a Redis
Cluster the plane passes an empty prefix: the scripts return the brokers to wake
and the plane sends each wake-up to that broker's stream itself (and a frame for
a Channel is appended first, then forwarded by a lookup when there is no log).

Times come from the broker's clock in ARGV, as the engine's scripts do, so
tests can move it; the keys also get a PEXPIRE a minute past their idle
expiry as a backstop for logs nobody touches again.
"""

from __future__ import annotations

from typing import Final

from gateway.engines.redis.scripts import Script

__all__ = [
    "LOG_ACK",
    "LOG_APPEND",
    "LOG_DIGEST",
    "LOG_DROP",
    "LOG_HELD_APPEND",
    "LOG_HOLD",
    "LOG_KEEP",
    "LOG_KEPT",
    "LOG_OPEN",
    "LOG_OR_FORWARD",
    "LOG_OR_HOLDER",
    "LOG_PENDING",
    "LOG_READ",
    "LOG_RELEASE",
    "LOG_RELEASE_COUNTED",
    "LOG_SALVAGE",
    "LOG_SALVAGED",
    "LOG_SCRIPTS",
    "LOG_SETTLED",
    "STREAM_TAKE",
]

#: KEYS: meta, stream, waiting. The functions every script below shares.
_PRELUDE: Final = """
local meta, stream, waiting, aside = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function live(now)
  local m = redis.call('HMGET', meta, 'x', 's')
  if not m[1] then return false end
  local idle = tonumber(m[1])
  if tonumber(m[2]) + idle <= now then
    redis.call('DEL', meta, stream, waiting, aside)
    return false
  end
  redis.call('HSET', meta, 's', now)
  redis.call('PEXPIRE', meta, idle + 60000)
  redis.call('PEXPIRE', stream, idle + 60000)
  return true
end
local function seq(id) return tonumber(string.sub(id, 3)) end
-- An entry holds one frame (fields f, t, c) or, written by LOG_HELD_APPEND, the
-- frames of one call packed (f: each a 4-byte big-endian length and the frame;
-- then t, c and k, how many). Its ID is the number of its last frame, so the
-- stream's order is still the numbers' order and one XRANGE from ``0-<m>``
-- starts at the entry holding frame m. One entry per call instead of one per
-- frame: Redis's work per logged frame was most of the log's share per queued
-- message (bench/README.md, "queues.py", issue 17). Retention may cut inside a
-- packed entry: the hash's ``d`` is the last number gone (absent: none cut),
-- and reads skip what an entry still holds through it.
local function count_of(e) return tonumber(e[2][8]) or 1 end
local function first_of(e) return seq(e[1]) - count_of(e) + 1 end
-- The sizes of e's frames, oldest first, without copying them.
local function sizes_of(e)
  if not e[2][8] then return {#e[2][2]} end
  local out, blob, pos = {}, e[2][2], 1
  while pos <= #blob do
    local len = struct.unpack('>I4', blob, pos)
    out[#out + 1] = len
    pos = pos + 4 + len
  end
  return out
end
-- e's frames as {number, frame, ...} from number ``from`` on, at most ``limit``.
local function frames_of(e, from, limit, out)
  local number = first_of(e)
  if not e[2][8] then
    if number >= from and limit > 0 then
      out[#out + 1] = number
      out[#out + 1] = e[2][2]
      return 1
    end
    return 0
  end
  local blob, pos, taken = e[2][2], 1, 0
  while pos <= #blob and taken < limit do
    local len = struct.unpack('>I4', blob, pos)
    if number >= from then
      out[#out + 1] = number
      out[#out + 1] = string.sub(blob, pos + 4, pos + 3 + len)
      taken = taken + 1
    end
    pos = pos + 4 + len
    number = number + 1
  end
  return taken
end
-- The bytes of e's frames numbered lo..hi.
local function bytes_in(e, lo, hi)
  local size, number = 0, first_of(e)
  for _, len in ipairs(sizes_of(e)) do
    if number >= lo and number <= hi then size = size + len end
    number = number + 1
  end
  return size
end
local function gone_through()
  return tonumber(redis.call('HGET', meta, 'd') or '0')
end
-- Frames through ``through`` leave the stream, whole entries and the head of the
-- one holding it; the byte count ``b`` follows.
local function drop_through(through)
  local d = gone_through()
  if through <= d then return end
  local size = 0
  for _, e in ipairs(redis.call('XRANGE', stream, '-', '0-' .. through)) do
    size = size + bytes_in(e, d + 1, through)
  end
  redis.call('XTRIM', stream, 'MINID', '0-' .. (through + 1))
  local e = redis.call('XRANGE', stream, '0-' .. (through + 1), '+', 'COUNT', 1)[1]
  if e and first_of(e) <= through then size = size + bytes_in(e, d + 1, through) end
  redis.call('HINCRBY', meta, 'b', -size)
  redis.call('HSET', meta, 'd', through)
end
local function ack(through)
  local m = redis.call('HMGET', meta, 'a', 'n')
  local acked, last = tonumber(m[1]), tonumber(m[2])
  if through > last then through = last end
  if through <= acked then return end
  drop_through(through)
  redis.call('HSET', meta, 'a', through)
end
-- What goes is always a prefix of the frames (oldest first), so the loop only
-- reads the head a page at a time and one XTRIM MINID drops it all: a held
-- WebSocket Channel's log is acknowledged only by retention, so once past
-- max_frames every append drops as many frames as it adds, and an XRANGE and an
-- XDEL per frame doubled Redis's work per message (bench/queues.py, issue 17).
--
-- Past max_frames (every append of a held log, once full) the frames that go
-- are not read at all: the numbers are contiguous (only prefixes ever leave),
-- so the last one to go is number n - max_frames, and the field ``c`` of its
-- entry (the log's bytes appended through that entry's last frame, the running
-- total kept in the hash's ``c``), less the sizes of the entry's frames after
-- it, gives the bytes left without summing the frames that go. Reading them cost
-- Redis about as much as appending them (bench/README.md, "queues.py"). A log
-- written before ``c`` existed has entries without it: those are summed.
local function trim(now, max_age, max_frames, max_bytes)
  local m = redis.call('HMGET', meta, 'b', 'a', 'n', 'c', 'd')
  local size, acked, newest = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
  local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  if not head then return end
  -- Frames through ``gone`` have left; the rest are contiguous through ``newest``.
  local gone = math.max(tonumber(m[5] or '0'), first_of(head) - 1)
  local count = newest - gone
  local cut = nil
  if count > max_frames and m[4] then
    local k = newest - max_frames
    local e = redis.call('XRANGE', stream, '0-' .. k, '+', 'COUNT', 1)[1]
    if e and e[2][6] then
      local through = tonumber(e[2][6])
      if seq(e[1]) > k then through = through - bytes_in(e, k + 1, seq(e[1])) end
      size = tonumber(m[4]) - through
      count = max_frames
      gone = k
      cut = k
    end
  end
  local from = '0-' .. (gone + 1)
  local ahead = 1
  while count > 0 do
    -- The frames over max_frames go whatever their age; then the head for the
    -- byte and age bounds, and the next page if those go on.
    local page = redis.call('XRANGE', stream, from, '+', 'COUNT',
                            math.max(count - max_frames, 0) + ahead)
    ahead = 16
    if #page == 0 then break end
    local stop = false
    for _, e in ipairs(page) do
      local fresh = tonumber(e[2][4]) > now - max_age
      -- Kept from its first frame held on, as usual: then its sizes are not read.
      if fresh and count <= max_frames and (count <= 1 or size <= max_bytes) then
        stop = true
        break
      end
      local number = first_of(e)
      for _, len in ipairs(sizes_of(e)) do
        if number > gone then
          local over = count > max_frames or (count > 1 and size > max_bytes)
          if not over and fresh then
            stop = true
            break
          end
          count = count - 1
          size = size - len
          gone = number
          cut = number
          if count == 0 then break end
        end
        number = number + 1
      end
      if stop or count == 0 then break end
    end
    if stop or count == 0 then break end
    from = '(' .. page[#page][1]
  end
  if cut then
    redis.call('XTRIM', stream, 'MINID', '0-' .. (cut + 1))
    redis.call('HSET', meta, 'd', cut)
    if cut > acked then redis.call('HSET', meta, 'l', cut) end
  end
  redis.call('HSET', meta, 'b', size)
end
-- The brokers to wake that a script could not reach itself: with an empty
-- prefix (on a Redis Cluster, where their streams are in other slots) the
-- caller sends the wake-ups, and the script returns these.
local woken = {}
local function wake_waiting(prefix, channel, cap)
  for _, b in ipairs(redis.call('SMEMBERS', waiting)) do
    if prefix == '' then
      woken[#woken + 1] = b
    else
      redis.call('XADD', '{' .. prefix .. 'in:' .. b .. '}', 'MAXLEN', '~', cap, '*',
        'k', 'w', 'o', '', 'i', channel, 'g', '', 'f', '')
    end
  end
end
-- The broker holding a resumable WebSocket Channel's log (field ``w``), which
-- delivers and logs every frame for it itself: false when none holds it. A
-- holder whose lease is gone is forgotten, so the log takes the frames until the
-- Channel resumes (with an empty prefix, on a cluster, leases are in other slots:
-- the holder stands, and the lookup after the script finds it dead).
local dead = false
local function holder(prefix)
  local w = redis.call('HGET', meta, 'w')
  if not w then return false end
  if prefix ~= '' and redis.call('EXISTS', '{' .. prefix .. '}alive:' .. w) == 0 then
    redis.call('HDEL', meta, 'w')
    dead = w
    return false
  end
  return w
end
local function append(frame, at, max_age, max_frames, max_bytes, prefix, channel, cap)
  local now = tonumber(at)
  if not live(now) then return 0 end
  local n = redis.call('HINCRBY', meta, 'n', 1)
  local c = redis.call('HINCRBY', meta, 'c', #frame)
  redis.call('XADD', stream, '0-' .. n, 'f', frame, 't', at, 'c', c)
  redis.call('HINCRBY', meta, 'b', #frame)
  trim(now, tonumber(max_age), tonumber(max_frames), tonumber(max_bytes))
  wake_waiting(prefix, channel, cap)
  redis.call('DEL', waiting)
  return n
end
-- A holder found dead (``dead``) may have died before reading frames forwarded to
-- it: they are still in its inbound stream (a broker trims what it read). They go
-- into the log first, oldest first, and out of that stream. At most SALVAGE
-- entries of the stream are looked at.
-- The frames of a packed ``d`` entry: each a 4-byte big-endian length and the frame.
local function frames(blob)
  local out = {}
  local pos = 1
  while pos <= #blob do
    local len
    len, pos = struct.unpack('>I4', blob, pos)
    out[#out + 1] = string.sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  return out
end
local function salvage(at, max_age, max_frames, max_bytes, prefix, channel, cap)
  if not dead or prefix == '' then return end
  local inbound = '{' .. prefix .. 'in:' .. dead .. '}'
  dead = false
  for _, e in ipairs(redis.call('XRANGE', inbound, '-', '+', 'COUNT', 10000)) do
    local f = {}
    for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
    if f['k'] == 'c' and f['i'] == channel then
      append(f['f'], at, max_age, max_frames, max_bytes, prefix, channel, cap)
      redis.call('XDEL', inbound, e[1])
    elseif f['k'] == 'd' and f['i'] == channel then
      -- Frames for this Channel packed in one entry (gateway.plane.redis.batches).
      for _, frame in ipairs(frames(f['f'])) do
        append(frame, at, max_age, max_frames, max_bytes, prefix, channel, cap)
      end
      redis.call('XDEL', inbound, e[1])
    end
  end
end
-- The release barrier (``v``): lifted, the frames held back behind it go into the
-- log, after everything its broker passed on before.
local function lift(at, max_age, max_frames, max_bytes, prefix, channel, cap)
  redis.call('HDEL', meta, 'v')
  for _, frame in ipairs(redis.call('LRANGE', aside, 0, -1)) do
    append(frame, at, max_age, max_frames, max_bytes, prefix, channel, cap)
  end
  redis.call('DEL', aside)
end
-- A frame routed to the Channel by broker ``by`` while nobody holds its log: into
-- the log, or, while the barrier of another broker is up, held back behind it (at
-- most max_frames: past that the barrier lifts, so the list stays bounded). The
-- number it got, a positive number when held back (it gets one when the barrier
-- lifts), 0 when there is no log.
local function route(frame, at, max_age, max_frames, max_bytes, prefix, channel, cap, by)
  local barrier = redis.call('HGET', meta, 'v')
  if not barrier or barrier == by then
    return append(frame, at, max_age, max_frames, max_bytes, prefix, channel, cap)
  end
  if not live(tonumber(at)) then return 0 end
  local waiting_frames = redis.call('RPUSH', aside, frame)
  redis.call('PEXPIRE', aside, tonumber(redis.call('HGET', meta, 'x')) + 60000)
  if waiting_frames >= tonumber(max_frames) then
    lift(at, max_age, max_frames, max_bytes, prefix, channel, cap)
  end
  return tonumber(redis.call('HGET', meta, 'n')) + waiting_frames
end
"""

#: ARGV: digest, idle ms, now ms.
LOG_OPEN: Final = Script(
    "log_open",
    _PRELUDE
    + """
redis.call('DEL', meta, stream, waiting, aside)
redis.call('HSET', meta, 'h', ARGV[1], 'x', ARGV[2], 's', ARGV[3], 'n', 0, 'a', 0, 'l', 0, 'b', 0,
           'c', 0)
redis.call('PEXPIRE', meta, tonumber(ARGV[2]) + 60000)
return 1
""",
)

#: ARGV: frame, now ms, max age ms, max frames, max bytes, plane prefix, channel,
#: inbound stream cap, the appending broker. Returns the frame's number, 0 when
#: there is no log (with an empty prefix, on a cluster: {number, the brokers to
#: wake, ...}); behind another broker's release barrier, held back (``route``).
LOG_APPEND: Final = Script(
    "log_append",
    _PRELUDE
    + """
local n = 0
if not holder(ARGV[6]) then
  salvage(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
  n = route(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9] or '')
end
if ARGV[6] == '' then
  table.insert(woken, 1, n)
  return woken
end
return n
""",
)

#: ``forward_to_channel`` (gateway.plane.redis.plane): into the Channel's log
#: when it has one (an HTTP Channel on a bus: any broker serves its client, so
#: the log is its only address), else to the live broker the directory lists
#: for it. ARGV: frame, now ms, max age ms, max frames, max bytes, plane
#: prefix, channel, inbound stream cap, self; KEYS[5]: the directory hash.
#: Returns '' (logged), the broker, or false. A forward to the holder records the
#: entry's ID (``wp``: its release barrier waits for it to be read).
LOG_OR_FORWARD: Final = Script(
    "log_or_forward",
    _PRELUDE
    + """
local target = holder(ARGV[6])
local held = target
if not target then
  salvage(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
  if route(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]) > 0
  then
    return ''
  end
  target = redis.call('HGET', KEYS[5], ARGV[7])
end
if not target then return false end
if redis.call('EXISTS', '{' .. ARGV[6] .. '}alive:' .. target) == 0 then return false end
local id = redis.call('XADD', '{' .. ARGV[6] .. 'in:' .. target .. '}', 'MAXLEN', '~', ARGV[8],
  '*', 'k', 'c', 'o', ARGV[9], 'i', ARGV[7], 'g', '', 'f', ARGV[1])
if held then redis.call('HSET', meta, 'wp', id) end
return target
""",
)

#: ARGV: through, now ms.
LOG_ACK: Final = Script(
    "log_ack",
    _PRELUDE
    + """
if live(tonumber(ARGV[2])) then ack(tonumber(ARGV[1])) end
return 1
""",
)

#: ARGV: after, limit, broker parking a reader ('' : none), now ms, max age ms,
#: max frames, max bytes. Returns false when there is no log, else
#: {newest number, gap, id, frame, id, frame, ...}.
LOG_READ: Final = Script(
    "log_read",
    _PRELUDE
    + """
local now = tonumber(ARGV[4])
if not live(now) then return false end
local after = tonumber(ARGV[1])
ack(after)
trim(now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
local m = redis.call('HMGET', meta, 'n', 'l', 'x', 'd')
local out = {tonumber(m[1]), tonumber(m[2])}
-- From the entry holding the first frame wanted; a packed entry may hold frames
-- before it, and frames retention cut (through ``d``).
local from = math.max(after, tonumber(m[4] or '0')) + 1
local left = tonumber(ARGV[2])
for _, e in ipairs(redis.call('XRANGE', stream, '0-' .. from, '+', 'COUNT', ARGV[2])) do
  if left <= 0 then break end
  left = left - frames_of(e, from, left, out)
end
if #out == 2 and ARGV[3] ~= '' then
  redis.call('SADD', waiting, ARGV[3])
  redis.call('PEXPIRE', waiting, tonumber(m[3]) + 60000)
end
return out
""",
)

#: ARGV: now ms. Returns the digest, or false when there is no log.
LOG_DIGEST: Final = Script(
    "log_digest",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return false end
return redis.call('HGET', meta, 'h')
""",
)

#: ARGV: now ms, the record: kept beside the log (its meta hash), gone with it.
LOG_KEEP: Final = Script(
    "log_keep",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return 0 end
redis.call('HSET', meta, 'k', ARGV[2])
return 1
""",
)

#: ARGV: now ms. Returns the record LOG_KEEP kept, false when none or no log.
LOG_KEPT: Final = Script(
    "log_kept",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return false end
return redis.call('HGET', meta, 'k')
""",
)

#: ARGV: plane prefix, channel, inbound stream cap: the log forgotten, its readers woken
#: (with an empty prefix, on a cluster: returns the brokers to wake).
LOG_DROP: Final = Script(
    "log_drop",
    _PRELUDE
    + """
wake_waiting(ARGV[1], ARGV[2], ARGV[3])
redis.call('DEL', meta, stream, waiting, aside)
return woken
""",
)

#: ARGV: now ms, max age ms, max frames, max bytes, plane prefix, channel, inbound
#: stream cap, broker. Returns false when there is no log, else {the previous
#: holder ('' none), the newest number}. A previous holder that died leaves what
#: is still in its inbound stream for the Channel to the log first (salvage).
LOG_HOLD: Final = Script(
    "log_hold",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return false end
local previous = redis.call('HGET', meta, 'w') or ''
if previous ~= '' and previous ~= ARGV[8] then
  holder(ARGV[5])
  salvage(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
end
-- A release barrier still up (the resume waited for it at most the bus lease,
-- gateway.connections.resume): a dead broker's unread frames go into the log first;
-- a live one's come later, forwarded here (as before the barrier existed). Then
-- what was held back behind it.
local barrier = redis.call('HGET', meta, 'v')
if barrier then
  if ARGV[5] ~= '' and redis.call('EXISTS', '{' .. ARGV[5] .. '}alive:' .. barrier) == 0 then
    dead = barrier
    salvage(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  end
  lift(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
end
redis.call('HDEL', meta, 'wp', 'q')
redis.call('HSET', meta, 'w', ARGV[8])
return {previous, tonumber(redis.call('HGET', meta, 'n'))}
""",
)

#: ARGV: now ms, max age ms, max frames, max bytes, plane prefix, channel, inbound
#: stream cap, the broker, the frames (all a Channel got in one turn of its
#: broker's loop: one call), how many, '1' to pack. The frames come packed (each
#: a 4-byte big-endian length and the frame) when there are several, and go into
#: the stream as one entry (see the prelude) when every broker of the bus reads
#: those ('1'), else one entry each, as older brokers wrote and read them; one
#: frame comes as it is. Returns the last one's number, 0 when there is no log,
#: -1 when another broker holds it (then none is appended). Retention is applied
#: once, after the last.
LOG_HELD_APPEND: Final = Script(
    "log_held_append",
    _PRELUDE
    + """
local now = tonumber(ARGV[1])
if redis.call('HGET', meta, 'w') ~= ARGV[8] then
  if redis.call('EXISTS', meta) == 0 then return 0 end
  return -1
end
-- Held, so in use: its holder touches it (and renews its expiry) every quarter of
-- the age, so an append stamps its last use and nothing more (no live()).
redis.call('HSET', meta, 's', now)
local count = tonumber(ARGV[10])
local n = redis.call('HINCRBY', meta, 'n', count)
local size = #ARGV[9]
if count > 1 then size = size - 4 * count end
local c = redis.call('HINCRBY', meta, 'c', size)
if count == 1 then
  redis.call('XADD', stream, '0-' .. n, 'f', ARGV[9], 't', ARGV[1], 'c', c)
elseif count > 1 and ARGV[11] == '1' then
  redis.call('XADD', stream, '0-' .. n, 'f', ARGV[9], 't', ARGV[1], 'c', c, 'k', count)
elseif count > 1 then
  -- A bus with an older broker: an entry per frame, which it reads.
  local blob, pos, number, through = ARGV[9], 1, n - count, c - size
  while pos <= #blob do
    local len = struct.unpack('>I4', blob, pos)
    number = number + 1
    through = through + len
    redis.call('XADD', stream, '0-' .. number, 'f', string.sub(blob, pos + 4, pos + 3 + len),
      't', ARGV[1], 'c', through)
    pos = pos + 4 + len
  end
end
redis.call('HINCRBY', meta, 'b', size)
trim(now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
return n
""",
)

#: ARGV: broker, now ms. The log is no longer held, if this broker held it: then,
#: if frames were forwarded to this broker for the Channel, the release barrier
#: (``v``) is this broker until it lifts it (LOG_SETTLED) and the ID of the last of
#: those entries is returned ('' none; false: not held here). Frames this broker
#: passes on go into the log from now on; other brokers' wait behind the barrier.
LOG_RELEASE: Final = Script(
    "log_release",
    _PRELUDE
    + """
if redis.call('HGET', meta, 'w') ~= ARGV[1] then return false end
redis.call('HDEL', meta, 'w')
local last = redis.call('HGET', meta, 'wp')
redis.call('HDEL', meta, 'wp')
if last then redis.call('HSET', meta, 'v', ARGV[1]) end
live(tonumber(ARGV[2]))
return last or ''
""",
)

#: ARGV: now ms, max age ms, max frames, max bytes, plane prefix, channel, inbound
#: stream cap, broker. The release barrier lifted, if this broker's: every frame
#: forwarded to it for the Channel while it held the log has been handled (passed
#: on into the log by calls that reached Redis before this one), so the frames held
#: back behind the barrier follow them into the log.
LOG_SETTLED: Final = Script(
    "log_settled",
    _PRELUDE
    + """
if redis.call('HGET', meta, 'v') == ARGV[8] then
  lift(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
end
return 1
""",
)

#: What a resume waits for before it holds the log (gateway.connections.resume): the
#: broker holding it, else the broker whose release barrier is up, else '' (false:
#: no log). A dead holder is forgotten and a dead barrier's broker passed over, its
#: unread frames for the Channel salvaged into the log first (with an empty prefix,
#: on a cluster, leases are in other slots: the broker is returned, the caller asks
#: whether it is alive). ARGV: now ms, max age ms, max frames, max bytes, plane
#: prefix, channel, inbound stream cap.
LOG_PENDING: Final = Script(
    "log_pending",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return false end
local w = holder(ARGV[5])
if w then return w end
salvage(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
local barrier = redis.call('HGET', meta, 'v')
if not barrier then return '' end
if ARGV[5] ~= '' and redis.call('EXISTS', '{' .. ARGV[5] .. '}alive:' .. barrier) == 0 then
  dead = barrier
  salvage(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  lift(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  return ''
end
return barrier
""",
)

#: Run by a broker that sweeps a dead one, before it deletes the dead broker's
#: inbound stream (KEYS[1]), and by a broker leaving the bus for its own: every
#: frame in it for a Channel whose log the gone broker held goes into that log,
#: oldest first, and the log is released; a frame for a Channel another live
#: broker holds now goes to that broker.
#: ARGV: plane prefix, dead broker, now ms, max age ms, max frames, max bytes,
#: inbound stream cap. Returns how many frames were saved.
LOG_SALVAGE: Final = Script(
    "log_salvage",
    _PRELUDE
    + """
local inbound = KEYS[1]
local prefix, gone, now = ARGV[1], ARGV[2], ARGV[3]
local saved = 0
-- Channels whose release barrier was the gone broker's: what waits behind it follows
-- once all of that broker's frames for them are in (after the loop).
local barred = {}
for _, e in ipairs(redis.call('XRANGE', inbound, '-', '+', 'COUNT', 10000)) do
  local f = {}
  for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
  if (f['k'] == 'c' or f['k'] == 'd') and f['i'] then
    local tag = '{' .. f['i'] .. '}'
    -- The prelude's functions work on these: this Channel's log now.
    meta = prefix .. 'log:' .. tag
    stream, waiting = prefix .. 'logs:' .. tag, prefix .. 'logw:' .. tag
    aside = prefix .. 'logv:' .. tag
    if redis.call('HGET', meta, 'w') == gone then redis.call('HDEL', meta, 'w') end
    -- Its frames for the Channel are saved here: its release barrier is down.
    if redis.call('HGET', meta, 'v') == gone then
      redis.call('HDEL', meta, 'v')
      barred[#barred + 1] = f['i']
    end
    local w = redis.call('HGET', meta, 'w')
    -- A ``d`` entry packs several frames for the Channel (gateway.plane.redis.batches).
    local list = {f['f']}
    if f['k'] == 'd' then list = frames(f['f']) end
    if redis.call('EXISTS', meta) == 1 and not w then
      for _, frame in ipairs(list) do
        if append(frame, now, ARGV[4], ARGV[5], ARGV[6], prefix, f['i'], ARGV[7]) > 0 then
          saved = saved + 1
        end
      end
    elseif w and redis.call('EXISTS', '{' .. prefix .. '}alive:' .. w) == 1 then
      -- Resumed at a live broker meanwhile (a rolling restart): the frames go
      -- there, as a forward would, instead of being dropped.
      for _, frame in ipairs(list) do
        local id = redis.call('XADD', '{' .. prefix .. 'in:' .. w .. '}', 'MAXLEN', '~', ARGV[7],
          '*', 'k', 'c', 'o', gone, 'i', f['i'], 'g', '', 'f', frame)
        redis.call('HSET', meta, 'wp', id)
        saved = saved + 1
      end
    end
    -- Handled once: a broker leaving salvages its own stream while another may
    -- be sweeping it (gateway.plane.redis.plane, _leave).
    redis.call('XDEL', inbound, e[1])
  end
end
for _, channel in ipairs(barred) do
  local tag = '{' .. channel .. '}'
  meta = prefix .. 'log:' .. tag
  stream, waiting = prefix .. 'logs:' .. tag, prefix .. 'logw:' .. tag
  aside = prefix .. 'logv:' .. tag
  lift(now, ARGV[4], ARGV[5], ARGV[6], prefix, channel, ARGV[7])
end
return saved
""",
)

#: On a Redis Cluster, ``forward_to_channel``'s first call (gateway.plane.redis.plane):
#: the holder, if one holds the log, with the frame counted as on its way to it
#: (``q``: its release barrier waits until its reader has read that many); else into
#: the log as LOG_APPEND (held back behind another broker's release barrier). ARGV
#: as LOG_APPEND's, the prefix empty. Returns {number (0: none), the holder ('': none),
#: the brokers to wake, ...}. The sender sends the frame to the holder itself, in
#: that broker's stream's slot, marked as counted (gateway.plane.redis.counted_barriers).
LOG_OR_HOLDER: Final = Script(
    "log_or_holder",
    _PRELUDE
    + """
local w = redis.call('HGET', meta, 'w')
if w then
  redis.call('HINCRBY', meta, 'q', 1)
  return {0, w}
end
local n = route(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
table.insert(woken, 1, w or '')
table.insert(woken, 1, n)
return woken
""",
)

#: LOG_RELEASE on a Redis Cluster. ARGV: broker, now ms, the frames counted as sent to
#: it (``q``) that its reader has read since it took the log. If more were sent, the
#: release barrier (``v``) is this broker until its reader has read them all and it
#: lifts it (LOG_SETTLED); returns how many were sent then, 0 when no barrier went
#: up, false when this broker did not hold the log.
LOG_RELEASE_COUNTED: Final = Script(
    "log_release_counted",
    _PRELUDE
    + """
if redis.call('HGET', meta, 'w') ~= ARGV[1] then return false end
redis.call('HDEL', meta, 'w')
local sent = tonumber(redis.call('HGET', meta, 'q') or '0')
redis.call('HDEL', meta, 'q', 'wp')
-- An expired log is gone whole (live): no barrier for it.
if live(tonumber(ARGV[2])) and sent > tonumber(ARGV[3]) then
  redis.call('HSET', meta, 'v', ARGV[1])
  return sent
end
return 0
""",
)

#: On a Redis Cluster, where a dead broker's inbound stream (KEYS[1]) is another slot
#: than the Channel logs: the frames in it for Channel ARGV[1] (every Channel when
#: '') taken out of it (XDEL), oldest first, to be saved into their logs by
#: LOG_SALVAGED. At most 10,000 entries are looked at. Returns {channel, frame, ...}.
STREAM_TAKE: Final = Script(
    "plane_stream_take",
    """
local out = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 10000)) do
  local f = {}
  for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
  if (f['k'] == 'c' or f['k'] == 'd') and f['i'] and (ARGV[1] == '' or f['i'] == ARGV[1]) then
    if f['k'] == 'c' then
      out[#out + 1] = f['i']
      out[#out + 1] = f['f']
    else
      -- Frames for the Channel packed in one entry (gateway.plane.redis.batches).
      local blob, pos = f['f'], 1
      while pos <= #blob do
        local len
        len, pos = struct.unpack('>I4', blob, pos)
        out[#out + 1] = f['i']
        out[#out + 1] = string.sub(blob, pos, pos + len - 1)
        pos = pos + len
      end
    end
    redis.call('XDEL', KEYS[1], e[1])
  end
end
return out
""",
)

#: On a Redis Cluster: the frames STREAM_TAKE took for this Channel out of the stream
#: of the dead broker ARGV[8] go into the log, oldest first, ahead of what waits
#: behind its release barrier; its hold (``w``) and its barrier (``v``) go. ARGV: now
#: ms, max age ms, max frames, max bytes, plane prefix (''), channel, inbound stream
#: cap, the dead broker, the frames. Returns {how many were saved, '', the brokers to
#: wake, ...}, or {-1, the holder} when another broker holds the log now (the caller
#: sends them there), {0, ''} when there is no log.
LOG_SALVAGED: Final = Script(
    "log_salvaged",
    _PRELUDE
    + """
if not live(tonumber(ARGV[1])) then return {0, ''} end
local gone = ARGV[8]
local w = redis.call('HGET', meta, 'w')
if w == gone then
  redis.call('HDEL', meta, 'w', 'q')
  w = false
end
if w then return {-1, w} end
local saved = 0
for i = 9, #ARGV do
  if append(ARGV[i], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]) > 0 then
    saved = saved + 1
  end
end
if redis.call('HGET', meta, 'v') == gone then
  lift(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
end
table.insert(woken, 1, '')
table.insert(woken, 1, saved)
return woken
""",
)

LOG_SCRIPTS: Final = (
    LOG_SALVAGE,
    LOG_HOLD,
    LOG_HELD_APPEND,
    LOG_RELEASE,
    LOG_SETTLED,
    LOG_PENDING,
    LOG_OPEN,
    LOG_APPEND,
    LOG_ACK,
    LOG_READ,
    LOG_DIGEST,
    LOG_DROP,
    LOG_OR_FORWARD,
    LOG_KEEP,
    LOG_KEPT,
    LOG_OR_HOLDER,
    LOG_RELEASE_COUNTED,
    STREAM_TAKE,
    LOG_SALVAGED,
)
