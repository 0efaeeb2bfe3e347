"""Forwards packed per destination: many envelopes in one stream entry, one script call.

Why
---
bench/cluster.py measured a forwarded Command at about 100 µs of broker CPU
per round trip against 30 µs on one broker, and a profile put most of it in
the per-call cost of Redis: a script call per forward (A's request, B's
``SEND_TO`` for the answer), its reply read by redis-py one by one, and a
stream entry of five fields parsed into Python objects by the reader. Under
load a hundred forwards to the same broker leave in the same loop turn, so
they can be one call and one entry instead of a hundred.

What
----
Two kinds of call gather forwards while their pipeline waits to be written
(gateway.engines.redis.batch): every answer for one Channel at one broker
(``send_to`` a CHANNEL envelope: :class:`FrameBatch`, one ``SEND_FRAMES`` call
adding one entry ``k=d``), and every User-Agent request for one Command-Name
(``forward_request`` on one Redis: :class:`RequestBatch`, one
``FORWARD_REQUESTS`` call that balances each request as a script call per
request did and adds one entry ``k=b`` per target broker; on a Redis Cluster the
call only looks the targets up, and one ``SEND_RECORDS`` call per target adds
the entry). A call takes envelopes only
until it is written, and only while no other plane call was submitted after
it (the plane seals its open calls then, :meth:`RedisPlane._submit`), so
envelopes still reach each broker in the order they were handed over. A call
holds at most :data:`MAX_ENVELOPES` envelopes and about :data:`MAX_BYTES`
bytes, so an entry is no larger than one big frame was, and the stream's cap
(``MAXLEN ~``) bounds the stream's bytes as before.

The entries
-----------
``k=d o=<origin> i=<Channel> f=<frames>``: frames for one Channel, each a
4-byte big-endian length and the frame. ``k=b o=<origin> f=<records>``:
envelopes, each a header (kind as one byte, then the lengths of the Channel,
``among`` and the frame, 4 bytes each, big-endian) and those three. The
Channel-log salvage (gateway.plane.redis.log_scripts) reads ``d`` entries as
it reads ``c`` ones; ``b`` entries hold requests only, which it never salvages.

Beside the records
------------------
A ``d`` entry may carry a field ``m`` too: each frame's ``u`` where the frame
is a whole answer to it (no ``t``, no ``o``; Envelope.command_id), empty where
not, joined by ","; the Channel's broker then closes its books for that answer
without decoding the frame.
A ``b`` entry of requests for one Command-Name may carry a field ``m``: the
name, a newline, and the ``u`` of each record in order, joined by "," (empty
for none). The sending broker decoded each request already, so the receiving
one routes it from these (Envelope.name, Envelope.command_id) instead of
decoding the frame again. It is added when one target takes the whole call
(the blob as it came: the usual case); where the script splits the records
among several targets, the entries go without it, and the receiver decodes as
it always did. Readers that predate it ignore a field they do not know, and an
entry without it (an older sender) is decoded, so no version value is needed
for it: the records themselves are unchanged.

Mixed versions (a rolling upgrade): a broker that reads these entries sets the
lease beside its stream (``{<prefix>in:<b>}live``) to ``2``; older brokers set
``1``. The scripts send packed entries only to a ``2`` and, to an older broker,
unpack in Lua and add one entry per envelope in the old format. New brokers
read old entries as before. So any mix of versions forwards correctly; only
the saving is lost towards an old broker.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from gateway.engines.redis.batch import Call, fail_future
from gateway.engines.redis.calls import script_command
from gateway.engines.redis.scripts import Script
from gateway.plane.base import Envelope, EnvelopeKind, PlaneUnavailable

__all__ = [
    "BATCH_SCRIPTS",
    "FORWARD_REQUESTS",
    "FRAMES",
    "LIVE_VERSION",
    "MAX_BYTES",
    "MAX_ENVELOPES",
    "RECORDS",
    "SEND_FRAMES",
    "SEND_RECORDS",
    "FrameBatch",
    "RecordBatch",
    "RequestBatch",
    "pack_answers",
    "pack_meta",
    "pack_record",
    "targets_of",
    "unpack_answers",
    "unpack_frames",
    "unpack_records",
]

#: The value of the lease beside a stream whose reader unpacks ``b`` and ``d`` entries.
LIVE_VERSION: Final = "2"
#: The ``k`` of an entry of frames for one Channel.
FRAMES: Final = b"d"
#: The ``k`` of an entry of envelopes (requests).
RECORDS: Final = b"b"
#: Envelopes one call (and so one stream entry) holds at most.
MAX_ENVELOPES: Final = 256
#: Bytes one call takes more envelopes up to (one envelope alone may be larger).
MAX_BYTES: Final = 64 * 1024

_LENGTH: Final = struct.Struct(">I")
_HEADER: Final = struct.Struct(">BIII")
_KINDS: Final = {ord(kind.value): kind for kind in EnvelopeKind}

# Lua: the send every script ends with (send_packed): one packed entry for a
# broker that reads them (its lease copy is LIVE_VERSION), else one old-format
# entry per frame or record, for a broker that predates packed entries.
_UNPACK: Final = (
    """
local function add_frames(stream, maxlen, origin, channel, blob)
  local pos = 1
  while pos <= #blob do
    local len
    len, pos = struct.unpack('>I4', blob, pos)
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
      'k', 'c', 'o', origin, 'i', channel, 'g', '', 'f', string.sub(blob, pos, pos + len - 1))
    pos = pos + len
  end
end
-- The records of a ``b`` entry (or of the blob a call is given), as strings.
local function records_of(blob)
  local out = {}
  local pos = 1
  while pos <= #blob do
    local _, lc, la, lf = struct.unpack('>BI4I4I4', blob, pos)
    local len = 13 + lc + la + lf
    out[#out + 1] = string.sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  return out
end
local function add_record(stream, maxlen, origin, record)
  local kind, lc, la, lf, pos = struct.unpack('>BI4I4I4', record)
  local channel = string.sub(record, pos, pos + lc - 1)
  local among = string.sub(record, pos + lc, pos + lc + la - 1)
  local frame = string.sub(record, pos + lc + la, pos + lc + la + lf - 1)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'k', string.char(kind), 'o', origin, 'i', channel, 'g', among, 'f', frame)
end
-- What every send does once it has read the target's lease copy ``version``: one
-- packed entry (``kind`` 'd': frames for ``channel``; 'b': records; with ``meta``
-- as field 'm' if given) for a broker that reads them, else one old-format entry
-- per frame or record.
local function send_packed(stream, version, maxlen, origin, kind, blob, channel, meta)
  if version == '"""
    + LIVE_VERSION
    + """' then
    if kind == 'd' and meta and meta ~= '' then
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
        'k', 'd', 'o', origin, 'i', channel, 'f', blob, 'm', meta)
    elseif kind == 'd' then
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
        'k', 'd', 'o', origin, 'i', channel, 'f', blob)
    elseif meta and meta ~= '' then
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
        'k', 'b', 'o', origin, 'f', blob, 'm', meta)
    else
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'k', 'b', 'o', origin, 'f', blob)
    end
  elseif kind == 'd' then
    add_frames(stream, maxlen, origin, channel, blob)
  else
    for _, record in ipairs(records_of(blob)) do add_record(stream, maxlen, origin, record) end
  end
end
"""
)

#: KEYS: the target's stream, the lease beside it; ARGV: self, Channel, frames
#: (packed), maxlen, their meta ('' for none: "Beside the records" above). 1 if
#: added, 0 if the target's lease is gone.
SEND_FRAMES: Final = Script(
    "plane_send_frames",
    _UNPACK
    + """
local v = redis.call('GET', KEYS[2])
if not v then return 0 end
send_packed(KEYS[1], v, ARGV[4], ARGV[1], 'd', ARGV[3], ARGV[2], ARGV[5])
return 1
""",
)

#: KEYS: name:<n>, fwd:<n>; ARGV: prefix, self, balance, stream prefix, maxlen, the
#: requests' records, packed one after another (one argument: hiredis packs a
#: command's arguments at about a microsecond each), how many records that is,
#: their meta ('' for none: "Beside the records" above; sent only where one
#: target takes them all).
#: ``in_flight``: each request goes to the least
#: loaded live broker (ties in turn), whose count goes up by one at once, so a
#: burst spreads before the next report; ``turns``: each in turn. Each target gets
#: one entry with its requests, in order. Returns the
#: target of each request, '' where none (no live broker serves the name, or the
#: target's lease beside its stream is gone); or, when one live broker serves the
#: name, that one target (or '') alone, for every request (:func:`targets_of`).
#: That case, two brokers with the Respondents on one of them, is the common one,
#: and there the records go on as the one blob they came in: splitting them into
#: Lua strings and joining them again was most of the script's time (bench/cluster.py,
#: a SLOWLOG of every call: about 5 µs of Redis per forwarded request).
FORWARD_REQUESTS: Final = Script(
    "plane_forward_requests",
    _UNPACK
    + """
local prefix, me, balance, stream_prefix, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[7])
local live = {}
local loads = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local b = fields[i]
  if b ~= me and redis.call('EXISTS', prefix .. 'alive:' .. b) == 1 then
    live[#live + 1] = b
    loads[b] = tonumber(fields[i + 1]) or 0
  end
end
if #live == 0 then return {''} end
local turn = redis.call('INCRBY', prefix .. 'turn', n) - n
if #live == 1 then
  -- Every request goes to the one target, in one entry: the blob as it came.
  local target = live[1]
  if stream_prefix ~= '' then
    local stream = '{' .. stream_prefix .. 'in:' .. target .. '}'
    local v = redis.call('GET', stream .. 'live')
    if not v then return {''} end
    send_packed(stream, v, maxlen, me, 'b', ARGV[6], nil, ARGV[8])
  end
  if balance == 'in_flight' then
    redis.call('HINCRBY', KEYS[1], target, n)
    redis.call('HINCRBY', KEYS[2], target, n)
  end
  return {target}
end
local requests = records_of(ARGV[6])
local out = {}
for j = 1, n do out[j] = '' end
table.sort(live)
local records = {}
local placed = {}
for j = 1, n do
  turn = turn + 1
  local target = live[(turn % #live) + 1]
  if balance == 'in_flight' then
    for k = 1, #live - 1 do
      local b = live[((turn + k) % #live) + 1]
      if loads[b] < loads[target] then target = b end
    end
    loads[target] = loads[target] + 1
  end
  if not records[target] then
    records[target] = {}
    placed[target] = {}
  end
  local list = records[target]
  list[#list + 1] = requests[j]
  placed[target][#list] = j
end
if stream_prefix == '' then
  -- A Redis Cluster: the streams are in other slots, so the caller sends
  -- (SEND_RECORDS); the counts go up here, as they would with the send.
  for _, target in ipairs(live) do
    local list = records[target]
    if list then
      if balance == 'in_flight' then
        redis.call('HINCRBY', KEYS[1], target, #list)
        redis.call('HINCRBY', KEYS[2], target, #list)
      end
      for _, j in ipairs(placed[target]) do out[j] = target end
    end
  end
  return out
end
for _, target in ipairs(live) do
  local list = records[target]
  if list then
    local stream = '{' .. stream_prefix .. 'in:' .. target .. '}'
    local v = redis.call('GET', stream .. 'live')
    if v then
      send_packed(stream, v, maxlen, me, 'b', table.concat(list))
      if balance == 'in_flight' then
        redis.call('HINCRBY', KEYS[1], target, #list)
        redis.call('HINCRBY', KEYS[2], target, #list)
      end
      for _, j in ipairs(placed[target]) do out[j] = target end
    end
  end
end
return out
""",
)

#: KEYS: the target's stream, the lease beside it; ARGV: self, maxlen, the records
#: packed one after another. 1 if added (one entry), 0 if the target's lease is gone.
SEND_RECORDS: Final = Script(
    "plane_send_records",
    _UNPACK
    + """
local v = redis.call('GET', KEYS[2])
if not v then return 0 end
send_packed(KEYS[1], v, ARGV[2], ARGV[1], 'b', ARGV[3])
return 1
""",
)

BATCH_SCRIPTS: Final = (SEND_FRAMES, FORWARD_REQUESTS, SEND_RECORDS)


def pack_record(envelope: Envelope) -> bytes:
    """One envelope as a record of a ``b`` entry (its origin is the entry's)."""
    channel = envelope.channel.encode()
    among = "\n".join(envelope.among).encode()
    frame = envelope.frame
    header = _HEADER.pack(ord(envelope.kind.value), len(channel), len(among), len(frame))
    return b"".join((header, channel, among, frame))


def pack_meta(name: str, command_ids: Sequence[int | None]) -> bytes:
    """The field ``m`` of a ``b`` entry of requests for ``name``, one ``u`` (or
    None) per record in order ("Beside the records" above)."""
    ids = ",".join("" if u is None else str(u) for u in command_ids)
    return f"{name}\n{ids}".encode()


def unpack_records(origin: str, blob: bytes, meta: bytes | None = None) -> Iterator[Envelope]:
    """The envelopes of a ``b`` entry, in order; ``meta``: its field ``m``, if any,
    whose name and ``u`` the envelopes it covers carry (Envelope.name).

    Raises:
        ValueError: the entry is not made of whole records (or struct.error), or
            its meta is not a name and numbers.
    """
    name: str | None = None
    ids: list[bytes] = []
    if meta:
        name_bytes, _, id_bytes = meta.partition(b"\n")
        name = name_bytes.decode()
        ids = id_bytes.split(b",")
    covered = len(ids)
    index = 0
    pos = 0
    end = len(blob)
    unpack = _HEADER.unpack_from
    size = _HEADER.size
    while pos < end:
        kind, lc, la, lf = unpack(blob, pos)
        pos += size
        channel = blob[pos : pos + lc].decode()
        pos += lc
        among = blob[pos : pos + la].decode()
        pos += la
        frame = blob[pos : pos + lf]
        pos += lf
        if pos > end:
            raise ValueError("a record runs past the end of its entry")
        envelope_kind = _KINDS.get(kind)
        if envelope_kind is None:
            raise ValueError(f"no envelope kind {kind}")
        groups = tuple(among.split("\n")) if among else ()
        if index < covered:
            u = ids[index]
            index += 1
            yield Envelope(
                envelope_kind, origin, channel, frame, groups, name, int(u) if u else None
            )
        else:
            yield Envelope(envelope_kind, origin, channel, frame, groups)


def pack_answers(command_ids: Sequence[int | None]) -> bytes:
    """The field ``m`` of a ``d`` entry: each frame's ``u`` where it is a whole
    answer, else empty; b"" when no frame is ("Beside the records" above)."""
    if not any(u is not None for u in command_ids):
        return b""
    return ",".join("" if u is None else str(u) for u in command_ids).encode()


def unpack_answers(meta: bytes | None) -> list[int | None]:
    """The ``u`` of each frame of a ``d`` entry whose field ``m`` is ``meta``
    (None for each frame past its end, or without one).

    Raises:
        ValueError: the meta is not numbers.
    """
    if not meta:
        return []
    return [int(u) if u else None for u in meta.split(b",")]


def unpack_frames(blob: bytes) -> Iterator[bytes]:
    """The frames of a ``d`` entry, in order.

    Raises:
        ValueError: the entry is not made of whole frames (or struct.error).
    """
    pos = 0
    end = len(blob)
    unpack = _LENGTH.unpack_from
    while pos < end:
        (length,) = unpack(blob, pos)
        pos += 4
        if pos + length > end:
            raise ValueError("a frame runs past the end of its entry")
        yield blob[pos : pos + length]
        pos += length


def targets_of(reply: Sequence[bytes], count: int) -> Sequence[bytes]:
    """``FORWARD_REQUESTS``'s reply as the target of each of its ``count`` requests:
    one target alone stands for every request (one live broker served the name).

    Raises:
        ValueError: the reply is neither one target nor one per request.
    """
    if len(reply) == count:
        return reply
    if len(reply) == 1:
        return list(reply) * count
    raise ValueError(f"{len(reply)} targets for {count} requests")


class _Batch(Call):
    """Envelopes gathered for one script call until its pipeline is written."""

    __slots__ = ("_futures", "_parts", "_size", "_then", "sealed")

    def __init__(self, then: tuple[tuple[Any, ...], ...]) -> None:
        self._parts: list[bytes] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._size = 0
        self._then = then
        #: Written (or about to be): it takes no more envelopes.
        self.sealed = False

    def full(self) -> bool:
        """Whether it takes no more envelopes: sealed, or at its bounds."""
        return self.sealed or len(self._parts) >= MAX_ENVELOPES or self._size >= MAX_BYTES

    def _add(self, part: bytes) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._parts.append(part)
        self._futures.append(future)
        self._size += len(part)
        return future

    def fail(self, error: BaseException) -> None:
        self.sealed = True
        unavailable = PlaneUnavailable(f"the bus is unreachable: {error}")
        unavailable.__cause__ = error
        for future in self._futures:
            fail_future(future, unavailable)


class FrameBatch(_Batch):
    """Frames for one Channel at one broker: one ``SEND_FRAMES`` call, one entry.

    Args:
        stream: the target's inbound stream; ``live`` the lease beside it.
        origin: this broker; ``channel`` the Channel the frames are for.
        maxlen: the stream's cap.
        then: commands written right after the call (WAIT on a cluster).
    """

    __slots__ = ("_args", "_ids", "_keys", "_sent")

    def __init__(
        self,
        stream: str,
        live: str,
        origin: str,
        channel: str,
        maxlen: int,
        then: tuple[tuple[Any, ...], ...],
    ) -> None:
        super().__init__(then)
        self._keys = (stream, live)
        self._args = (origin, channel, maxlen)
        #: Each frame's ``u`` where it is a whole answer (the entry's meta).
        self._ids: list[int | None] = []

    def add(self, frame: bytes, command_id: int | None = None) -> asyncio.Future[bool]:
        """Take ``frame`` (a whole answer to ``command_id``, if given); the future
        says whether the target's lease still held.

        One future for every frame of the call: they are one entry, so they reach
        the target together or not at all, and a caller that sees the future it
        got for the frame before (gateway.routing.remote.ForwardingOutbox) needs
        one callback for all of them rather than a future and a callback each.
        """
        part = _LENGTH.pack(len(frame)) + frame
        self._ids.append(command_id)
        if not self._futures:
            return self._add(part)
        self._parts.append(part)
        self._size += len(part)
        return self._futures[0]

    def commands(self) -> Sequence[tuple[Any, ...]]:
        self.sealed = True
        origin, channel, maxlen = self._args
        args = (origin, channel, b"".join(self._parts), maxlen, pack_answers(self._ids))
        return (script_command(SEND_FRAMES, self._keys, args), *self._then)

    def settle(self, replies: Sequence[Any]) -> None:
        reply = replies[0]
        if isinstance(reply, Exception):
            self.fail(reply)
            return
        added = bool(reply)
        for future in self._futures:
            if not future.done():
                future.set_result(added)


#: Sends the records to a broker on a cluster: (target, records, their futures).
Send = Callable[[str, list[bytes], list["asyncio.Future[Any]"]], None]


class RequestBatch(_Batch):
    """Requests for one Command-Name: one ``FORWARD_REQUESTS`` call.

    Args:
        keys: name:<n> and fwd:<n>.
        lookup: prefix, self, balance, stream prefix ('' on a cluster), maxlen.
        name: the Command-Name (a batch takes only its own).
        placed: told each target found, once (the plane's peers).
        send: on a cluster, where the script only looks the targets up: sends each
            target its records (:class:`RecordBatch`), which settles their futures.
    """

    __slots__ = ("_ids", "_keys", "_lookup", "_placed", "_send", "name")

    def __init__(
        self,
        keys: tuple[str, str],
        lookup: tuple[Any, ...],
        name: str,
        placed: Callable[[str], None],
        send: Send | None = None,
    ) -> None:
        super().__init__(())
        self._keys = keys
        self._lookup = lookup
        self._placed = placed
        self._send = send
        self.name = name
        #: Each request's ``u``, while every one said its name (Envelope.name);
        #: None once one did not: then the entry goes without its meta.
        self._ids: list[int | None] | None = []

    def add(self, envelope: Envelope) -> asyncio.Future[str | None]:
        """Take ``envelope``; the future: the broker it went to, or None."""
        ids = self._ids
        if ids is not None:
            if envelope.name == self.name:
                ids.append(envelope.command_id)
            else:
                self._ids = None
        return self._add(pack_record(envelope))

    def commands(self) -> Sequence[tuple[Any, ...]]:
        self.sealed = True
        ids = self._ids
        meta = pack_meta(self.name, ids) if ids else b""
        args = (*self._lookup, b"".join(self._parts), len(self._parts), meta)
        return (script_command(FORWARD_REQUESTS, self._keys, args),)

    def settle(self, replies: Sequence[Any]) -> None:
        reply = replies[0]
        if isinstance(reply, Exception):
            self.fail(reply)
            return
        reply = targets_of(reply, len(self._parts))
        if self._send is not None:
            self._send_each(reply)
            return
        targets: dict[bytes, str | None] = {b"": None}
        for future, target in zip(self._futures, reply, strict=True):
            broker = targets.get(target, "")
            if broker == "":
                broker = targets[target] = target.decode()
                self._placed(broker)
            if not future.done():
                future.set_result(broker)

    def _send_each(self, reply: Sequence[bytes]) -> None:
        assert self._send is not None
        per: dict[bytes, tuple[list[bytes], list[asyncio.Future[Any]]]] = {}
        for part, future, target in zip(self._parts, self._futures, reply, strict=True):
            if not target:
                if not future.done():
                    future.set_result(None)
                continue
            records, futures = per.setdefault(target, ([], []))
            records.append(part)
            futures.append(future)
        for target, (records, futures) in per.items():
            self._send(target.decode(), records, futures)


class RecordBatch(_Batch):
    """Records already placed (a cluster's lookup) for one broker: one ``SEND_RECORDS``
    call, one entry; each future gets the target, or None if its lease is gone.

    Args:
        stream: the target's inbound stream; ``live`` the lease beside it.
        origin: this broker; ``target`` the broker the stream is read by.
        maxlen: the stream's cap.
        then: commands written right after the call (WAIT on a cluster).
        placed: told the target once the records are in its stream.
    """

    __slots__ = ("_args", "_keys", "_placed", "_target")

    def __init__(
        self,
        stream: str,
        live: str,
        origin: str,
        target: str,
        maxlen: int,
        then: tuple[tuple[Any, ...], ...],
        placed: Callable[[str], None],
    ) -> None:
        super().__init__(then)
        self._keys = (stream, live)
        self._args = (origin, maxlen)
        self._target = target
        self._placed = placed

    def take(self, records: list[bytes], futures: list[asyncio.Future[Any]]) -> None:
        """Take ``records`` whose futures are ``futures`` (one each)."""
        self._parts = records
        self._futures = futures
        self.sealed = True

    def commands(self) -> Sequence[tuple[Any, ...]]:
        self.sealed = True
        args = (*self._args, b"".join(self._parts))
        return (script_command(SEND_RECORDS, self._keys, args), *self._then)

    def settle(self, replies: Sequence[Any]) -> None:
        reply = replies[0]
        if isinstance(reply, Exception):
            self.fail(reply)
            return
        target = self._target if reply else None
        if target is not None:
            self._placed(target)
        for future in self._futures:
            if not future.done():
                future.set_result(target)
