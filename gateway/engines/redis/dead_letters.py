"""The Redis engine's dead letters: the Lua that keeps them and moves them back.

A queue ``Q``'s dead letters are a list, ``asbp:q:Q:dd``, beside its streams:
one msgpack array per message, ``{priority, expiration, header, payload,
notice spec, deliveries}``, oldest first, trimmed to
:data:`~gateway.engines.base.MAX_DEAD_LETTERS` (the newest kept). The fetch
and release scripts (gateway.engines.redis.scripts) call :data:`BURY`'s
``bury`` where they used to drop a message whose ``max_deliveries``-th
delivery ended; it finds the list from the stream's own key (same prefix,
suffix ``dd``), so those scripts take no new key or argument. Moving them back
(:data:`REQUEUE`) is one script: room is checked and each message stored as a
new one, atomically, so a message is never both dead and queued, nor lost
between the two.

The code lives here rather than in ``scripts.py`` so that the per-message
scripts there change by one line each.
"""

from __future__ import annotations

from typing import Final

from gateway.engines.base import MAX_DEAD_LETTERS

__all__ = ["BURY", "DEAD_LETTERS_SUFFIX", "LIST", "REQUEUE"]

#: The suffix of a queue's dead-letter list (two characters, as every suffix).
DEAD_LETTERS_SUFFIX: Final = "dd"

#: A helper for the prelude: ``bury(stream, id, deliveries)`` moves entry ``id``
#: of ``stream`` (a key ending in ``s<priority>``) to its queue's dead letters
#: and removes it from the stream; returns the entry's fields (nil if gone).
BURY: Final = f"""
local function bury(stream, id, deliveries)
  local entry = redis.call('XRANGE', stream, id, id)[1]
  if entry then
    local f = entry[2]
    local dead = string.sub(stream, 1, -3) .. '{DEAD_LETTERS_SUFFIX}'
    local p = tonumber(string.sub(stream, -1))
    redis.call('RPUSH', dead, cmsgpack.pack({{p, f[6], f[2], f[4], f[8] or '', deliveries}}))
    redis.call('LTRIM', dead, -{MAX_DEAD_LETTERS}, -1)
  end
  drop(stream, {{id}})
  return entry and entry[2]
end
"""

#: Move up to ``count`` dead letters back, oldest first (after the prelude).
#: KEYS: the queue's block (delayed, waiting, s0..s9), its dead letters, the
#: expiry index. ARGV: queue, count, max_queue_depth, now, wake channel.
#: Returns how many it moved back (expired ones are dropped, not counted).
REQUEUE: Final = """
local queue, now_s = ARGV[1], ARGV[4]
local now = tonumber(now_s)
local made, moved, soonest = {}, 0, nil
-- Due delayed messages were "received" before these come back (as ENQUEUE does).
promote(1, queue, now_s, made, 1000)
local wanted, room = tonumber(ARGV[2]), tonumber(ARGV[3]) - depth(1)
while moved < wanted and room > 0 do
  local packed = redis.call('LPOP', KEYS[13])
  if not packed then break end
  local m = cmsgpack.unpack(packed)  -- {p, x, h, payload, n, deliveries}
  if tonumber(m[2]) > now then
    store(1, queue, now_s, made, m[1], '', m[2], m[3], m[4], m[5])
    soonest = sooner(soonest, '', m[2], now_s)
    moved = moved + 1
    room = room - 1
  end
end
if soonest then redis.call('ZADD', KEYS[14], 'LT', soonest, queue) end
if moved > 0 then wake(1, ARGV[5]) end
return moved
"""

#: Read dead letters without moving them (needs no prelude: sent with EVAL).
#: KEYS: the dead-letter list. ARGV: count. Returns {header, payload,
#: deliveries, ...}, oldest first.
LIST: Final = """
local out = {}
for _, packed in ipairs(redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local m = cmsgpack.unpack(packed)
  out[#out + 1] = m[3]
  out[#out + 1] = m[4]
  out[#out + 1] = m[6]
end
return out
"""
