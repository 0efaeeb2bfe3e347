"""decode and encode: frames to Commands and back, with no I/O.

ASBP has no length field: the body runs to the end of the frame. So every
transport frame (a WebSocket message, an HTTP body, one part of a multipart
response) carries exactly one Command, and the codec works on whole frames.

Theory of operation for ``decode``, which every inbound Command crosses.
There are two paths, and the slow one is the authority.

The reference path, ``_decode_reference``, reads any frame:

1. Size checks that cost nothing: the frame limit, then the header
   terminator, found with ``bytes.find`` (a quote before it sends us to a
   quote-aware scan, since quoted tokens may hold ";").
2. The header bytes become text: ASCII, or UTF-8 after a leading "+".
3. One regular expression accepts or rejects the whole header. Only on
   rejection does ``_diagnose`` walk the text by hand to say what is wrong
   and at which byte.
4. ``findall`` splits the accepted text into pairs, the reserved keys get
   their rules checked, and the Command is built without checking again.

It costs about twice what ``urllib.parse.parse_qsl`` costs on the same
pairs: the regular expressions spend 5-10 ns on every character. So
``decode`` first tries the fast path, ``_decode_fast``, which reads the
common case (an ASCII header, no "+", the usual reserved keys) with a
handful of whole-string operations that run at C speed, and returns either
exactly the Command the reference would return or None, "not sure". On None
the reference decides, so every refusal, and every fault code and offset,
comes from the reference; the fast path never raises and never accepts
what the reference refuses. tests/asbp/test_fastpath.py holds the two to
that with Hypothesis. The fast path:

1. Splits the frame at the first ";" (``bytes.partition``) and checks the
   sizes against the limits. Quotes come in pairs, so an odd number of them
   before that ";" means it sits inside a quoted token: give up.
2. Splitting the header on "'" yields the skeleton (the header with every
   quoted token's text taken out, its two quotes left as one "'" marker)
   and the quoted texts, in order. A marker right before "=" is a quoted
   key: give up.
3. One ``bytes.translate`` deletes the bare characters and the markers from
   the skeleton. What is left, the signature, must be exactly "=,=,...,="
   once the lists are taken out, which proves in one go that every
   character outside quotes is allowed and that keys and values alternate.
   A second ``translate`` maps "=", "[" and "]" to "," so that one
   ``split`` yields every token: token n is what lies between characters
   n - 1 and n of the signature, and a list shows up as its items between
   two empty tokens ("=[" and "]," both become ",,").
4. The quoted texts replace the markers, in order. Each list is folded into
   a tuple; the signature must hold exactly "[", commas and "]" where its
   tokens say the list is, and that part is cut out, which keeps tokens and
   signature in step. Anything that does not fit exactly (a marker glued to
   a bare token, an empty key or value, a list in a key's place) makes an
   index search fail or the signature differ: give up.
5. ``dict`` pairs the tokens up; fewer entries than pairs means a duplicate
   key. The reserved keys it handles are checked in batches (the three
   hex identifiers with one ``translate``); the rare ones (e, f, m, o, p,
   r, t, z) it leaves to the reference.

It gives up on anything else it does not handle (UTF-8 headers, a ";",
CR, LF or non-ASCII byte inside quotes, empty quoted tokens, empty lists,
lists of more than 64 items, more than 64 keys) rather than grow branches:
those frames are rare, and the reference reads them correctly, only
slower. On bench/codec.py's frame (six keys, a list, a quoted item) the fast
path takes about 40% of the reference's time, which is still about 90% of
what ``parse_qsl`` takes, not the 50% aimed for: splitting, the dict and
the Command alone cost a third of ``parse_qsl``, and each check, each list
and each quoted token adds tens of nanoseconds more.

So before both, ``decode`` tries the C accelerator, ``asbp._speedups``
(asbp/_speedups.c), when it was built: a bounds-checked scan of the header
bytes that returns the header dict and the body, or None, under the same
contract as the fast path (tests/asbp/test_speedups.py holds it to the
reference, and to reading everything the fast path reads). It also reads a
";" inside quotes, and any number of keys and list items within the
limits; its opening comment lists exactly what it reads. On the benchmark
frame, ``decode`` through it takes about a fifth of ``parse_qsl``'s time.
Like websockets' ``speedups.c``, it is optional: the build skips it where
there is no compiler, and then the two Python paths answer alone, with the
same results. ``speedups_enabled`` turns it off at run time (for tests and
benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NoReturn

from asbp.command import Command, _trusted
from asbp.errors import (
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
)
from asbp.grammar import (
    BARE_CHAR_RE,
    BARE_RE,
    DEFAULT_LIMITS,
    HEADER_END_RE,
    HEADER_RE,
    ITEM_RE,
    PAIR_RE,
    QUOTE,
    RESERVED,
    UTF8_MARKER,
    Limits,
)
from asbp.header import RESERVED_KEYS, Arity, HeaderValue, check_value

__all__ = ["decode", "encode"]

_SEMICOLON = 0x3B
_PLUS = 0x2B

#: The C accelerator's decode_fast, or None where it was not built.
_decode_c: Callable[[bytes, int, int, int, int], tuple[dict[str, HeaderValue], bytes] | None] | None
try:
    from asbp._speedups import decode_fast as _decode_c
except ImportError:  # no compiler at install time, or another interpreter
    _decode_c = None

#: Whether ``decode`` tries the C accelerator first (when it was built). Set
#: it to False to run the pure-Python paths alone, as the tests and
#: bench/codec.py do; results are the same either way, only slower. A switch
#: for tests and benchmarks, not a setting: asbp/ reads no environment.
speedups_enabled: bool = _decode_c is not None


def decode(frame: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Command:
    """Read one Command from one frame.

    Args:
        frame: the whole transport frame (bytes-like).
        limits: the size limits to enforce.

    Raises:
        ProtocolError: the frame is too large or the header is malformed or
            breaks a reserved key's rule; ``.code`` says which, ``.offset``
            says where.
    """
    if speedups_enabled and _decode_c is not None:
        found = _decode_c(
            frame,
            limits.max_frame_bytes,
            limits.max_header_bytes,
            limits.max_keys,
            limits.max_list_items,
        )
        if found is not None:
            return _trusted(*found)
    command = _decode_fast(frame, limits)
    if command is None:
        command = _decode_reference(frame, limits)
    return command


# -- the fast path ---------------------------------------------------------------

#: The ASCII bytes a bare token may hold, taken from the grammar itself.
_BARE_BYTES: Final = bytes(c for c in range(0x80) if BARE_CHAR_RE.fullmatch(chr(c)))
#: What the signature ``translate`` deletes: bare bytes and quote markers
#: (a marker's place is checked when its text goes in).
_SIGNATURE_DELETE: Final = _BARE_BYTES + b"'"
#: Turns every separator into "," for one ``split``.
_SEPARATORS_TO_COMMA: Final = bytes.maketrans(b"=[]", b",,,")
#: The most keys and list items the fast path takes (the default key limit).
_FAST_MAX: Final = 64
#: The signature of a flat header, by number of tokens: "=" between a key and
#: its value, "," between pairs. None where no header has that many tokens.
_SIGNATURES: Final = tuple(
    b"=," * (count // 2 - 1) + b"=" if count and not count & 1 else None
    for count in range(2 * _FAST_MAX + 1)
)
#: A list's part of the signature, by number of items (the empty list, which
#: the fast path leaves to the reference, is there only to keep the index).
_LIST_SIGNATURES: Final = (
    b"[]",
    *(b"[" + b"," * (size - 1) + b"]" for size in range(1, _FAST_MAX + 1)),
)
#: Reserved keys whose rules the fast path checks below. When a rule in
#: header.py changes, this and the checks in _decode_fast must follow; the
#: agreement tests fail until they do.
_FAST_KEYS: Final = frozenset("abcdgisux")
#: Reserved keys left to the reference (rare, and with costlier rules).
_SLOW_KEYS: Final = frozenset(RESERVED_KEYS) - _FAST_KEYS
#: Reserved keys that take one value, so never a list.
_SINGLE_KEYS: Final = frozenset(k for k in _FAST_KEYS if RESERVED_KEYS[k].arity is Arity.ONE)
_HEX_DIGITS: Final = b"0123456789abcdef"
_QUOTE: Final = ord("'")
_CR: Final = ord("\r")
_LF: Final = ord("\n")
#: Stands in for an absent i, s or d so the identifier check needs no branch.
_SOME_ID: Final = "0" * 32


def _decode_fast(frame: bytes, limits: Limits) -> Command | None:
    """Return the Command ``_decode_reference`` would return, or None.

    None means only "not sure": the frame may be valid or not. This never
    raises (for any bytes and limits) and never returns a Command the
    reference would refuse or return differently.
    """
    if type(frame) is not bytes or len(frame) > limits.max_frame_bytes:
        return None
    raw, terminated, body = frame.partition(b";")
    if not terminated or len(raw) > limits.max_header_bytes:
        return None
    # Byte values, not b"'": ``int in bytes`` is a bare memchr (15 ns), while
    # ``bytes in bytes`` first tries the int path and fails (100 ns).
    quoted = _QUOTE in raw
    if quoted:
        # CR and LF are refused inside quotes and out, and without the "+"
        # marker quoted text is ASCII too: one look at the whole header each.
        if _CR in raw or _LF in raw or not raw.isascii():
            return None
        parts = raw.split(b"'")
        skeleton = b"'".join(parts[::2])
        if not len(parts) & 1 or skeleton.find(b"'=") != -1:
            return None  # the ";" is inside quotes, or a key is quoted
    else:
        skeleton = raw
    signature = skeleton.translate(None, _SIGNATURE_DELETE)
    # Annotated Any: list items turn into tuples below.
    tokens: list[Any] = skeleton.translate(_SEPARATORS_TO_COMMA).decode("latin-1").split(",")
    try:
        if quoted:
            at = 0
            for content in parts[1::2]:
                if not content:
                    return None  # '' is valid for some keys only: leave it
                at = tokens.index("'", at + 1)
                tokens[at] = content.decode()
        count = len(tokens)
        if signature != _SIGNATURES[count]:
            # Lists, or a malformed header. Token n lies between characters
            # n - 1 and n of the signature (while the signature holds only
            # separators, and any other character makes it fail the last
            # comparison anyway). So a list's items lie between two empty
            # tokens, and the signature between them must be exactly "[",
            # commas and "]". Folding the list into one token and cutting its
            # part out of the signature keeps the two in step.
            max_items = limits.max_list_items
            start = tokens.index("")
            while True:
                end = tokens.index("", start + 1)
                size = end - start - 1
                if (
                    not start & 1  # in a key's place
                    or not 0 < size <= max_items
                    or tokens[start - 1] in _SINGLE_KEYS  # a list where one value goes
                    or not signature.startswith(_LIST_SIGNATURES[size], start)
                ):
                    return None
                signature = signature[:start] + signature[end:]
                tokens[start : end + 1] = (tuple(tokens[start + 1 : end]),)
                if "" not in tokens:
                    break
                start = tokens.index("")
            count = len(tokens)
            if signature != _SIGNATURES[count]:
                return None
        elif "" in tokens:
            return None  # an empty key or value
    except (IndexError, ValueError):  # no such marker or list end, or too big
        return None
    if count > 2 * limits.max_keys:
        return None
    pairs = iter(tokens)
    # Any, not HeaderValue: the single-value keys read below hold str, since
    # lists were refused for them above, but the type cannot say so.
    header: dict[str, Any] = dict(zip(pairs, pairs))  # noqa: B905 (even count; strict costs 150 ns)
    if 2 * len(header) != count or not _SLOW_KEYS.isdisjoint(header):
        return None  # a duplicate key, or a rare reserved key
    # Every token is non-empty by now, so a, b, c, g and x hold; lists of
    # single-value keys were refused above. Left: the 32-hex identifiers
    # i, s and d (one or more), and u.
    get = header.get
    channel = get("i", _SOME_ID)
    subject = get("s", _SOME_ID)
    destinations = get("d", _SOME_ID)
    if type(destinations) is str:
        if not len(channel) == len(subject) == len(destinations) == 32:
            return None
        identifiers = f"{channel}{subject}{destinations}"
    else:
        if {len(channel), len(subject), *map(len, destinations)} != {32}:
            return None
        identifiers = "".join((channel, subject, *destinations))
    if identifiers.encode().translate(None, _HEX_DIGITS):
        return None
    command_id = get("u")
    if command_id is not None and not (
        command_id.isdigit()
        and (len(command_id) < 5 or (len(command_id) == 5 and command_id <= "65535"))
        and (command_id[0] != "0" or len(command_id) == 1)
    ):
        return None
    return _trusted(header, body)


# -- the reference path ----------------------------------------------------------


def _decode_reference(frame: bytes, limits: Limits) -> Command:
    """The authoritative reading of any frame: see ``decode`` for the contract."""
    if type(frame) is not bytes:
        # bytes() would also take an int (that many NUL bytes) or any iterable
        # of ints; only real bytes-like objects are frames.
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise TypeError(f"a frame is bytes-like, not {type(frame).__name__}")
        if len(frame) > limits.max_frame_bytes:  # before copying it
            raise FrameTooLarge(
                f"frame of {len(frame)} bytes exceeds the limit of {limits.max_frame_bytes}",
                offset=limits.max_frame_bytes,
            )
        frame = bytes(frame)
    size = len(frame)
    if size > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"frame of {size} bytes exceeds the limit of {limits.max_frame_bytes}",
            offset=limits.max_frame_bytes,
        )
    header_limit = limits.max_header_bytes
    end = frame.find(b";", 0, header_limit + 1)
    if end == -1 or frame.find(b"'", 0, end) != -1:
        end = _quoted_header_end(frame, header_limit)
    if frame[0] == _PLUS:
        base = 1
        raw = frame[1:end]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedHeader(
                f"header is not valid UTF-8 ({exc.reason})", offset=base + exc.start
            ) from None
    else:
        base = 0
        raw = frame[:end]
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise MalformedHeader(
                f"byte 0x{raw[exc.start]:02x} is not ASCII and the header does not start "
                "with '+', the UTF-8 marker",
                offset=exc.start,
            ) from None
    if HEADER_RE.fullmatch(text) is None:
        _diagnose(text, base)
    pairs = PAIR_RE.findall(text)
    if len(pairs) > limits.max_keys:
        raise TooManyKeys(
            f"header has {len(pairs)} keys, more than the limit of {limits.max_keys}",
            offset=_key_offset(text, base, limits.max_keys),
        )
    header: dict[str, HeaderValue] = {}
    max_items = limits.max_list_items
    for key, token, items in pairs:
        if key in header:
            raise MalformedHeader(
                f"duplicate key {key!r}", offset=_key_offset(text, base, len(header))
            )
        value: HeaderValue
        if token:
            value = token[1:-1] if token[0] == QUOTE else token
        else:
            tokens = ITEM_RE.findall(items)
            if len(tokens) > max_items:
                raise TooManyListItems(
                    f"list of {key!r} has {len(tokens)} items, more than the limit of {max_items}",
                    offset=_key_offset(text, base, len(header)),
                )
            value = tuple([t[1:-1] if t[0] == QUOTE else t for t in tokens])
        if key in RESERVED_KEYS:
            reason = check_value(key, value)
            if reason is not None:
                raise InvalidHeaderValue(key, reason, offset=_key_offset(text, base, len(header)))
        header[key] = value
    return _trusted(header, frame[end + 1 :])


def _quoted_header_end(frame: bytes, header_limit: int) -> int:
    """Find the terminator when quotes may hide a ";" (or none was found)."""
    # Clamped: re takes no position past a C ssize_t, and Limits may be huge.
    match = HEADER_END_RE.match(frame, 0, min(header_limit + 1, len(frame)))
    assert match is not None  # the pattern matches the empty string
    end = match.end()
    if end <= header_limit:
        if end == len(frame):
            raise MalformedHeader("no ';' ends the header", offset=end)
        if frame[end] == _SEMICOLON:
            return end
        # HEADER_END_RE stops only at ";" or at a quote it cannot close in
        # the window; a quote closed past the window is a header too long.
        if frame.find(b"'", end + 1) == -1:
            raise MalformedHeader("quoted token is never closed", offset=end)
    raise HeaderTooLarge(
        f"no ';' ends the header within the limit of {header_limit} bytes",
        offset=header_limit,
    )


def _byte_offset(text: str, index: int, base: int) -> int:
    return base + len(text[:index].encode("utf-8"))


def _key_offset(text: str, base: int, pair_index: int) -> int:
    """The byte offset of the key of the pair at ``pair_index``."""
    for n, match in enumerate(PAIR_RE.finditer(text)):
        if n == pair_index:
            return _byte_offset(text, match.start(), base)
    raise AssertionError("pair index beyond the header")  # pragma: no cover


def _describe(char: str) -> str:
    if char == UTF8_MARKER:
        return "'+' (the UTF-8 marker may only be the first byte of a header)"
    if char.isspace():
        return f"whitespace U+{ord(char):04X} outside quotes"
    if char in RESERVED:
        return f"reserved character {char!r}"
    if BARE_CHAR_RE.match(char):
        # A character a bare token may hold, but not here (after a quoted
        # token or a list, where only "," or ";" may follow).
        return repr(char)
    return f"control character U+{ord(char):04X} outside quotes"


def _diagnose(text: str, base: int) -> NoReturn:
    """Walk a header the fast path refused and raise what is wrong, where.

    This is the grammar of grammar.py written out by hand. It must raise for
    exactly the texts HEADER_RE refuses; the tests hold it to that.
    """

    def fail(message: str, index: int) -> NoReturn:
        raise MalformedHeader(message, offset=_byte_offset(text, index, base))

    def bare(pos: int) -> int:
        while pos < size and BARE_CHAR_RE.match(text, pos):
            pos += 1
        return pos

    def token(pos: int, what: str) -> int:
        if pos == size:
            fail(f"{what} is missing before the end of the header", pos)
        if text[pos] == QUOTE:
            close = text.find(QUOTE, pos + 1)
            newline = min(
                (i for i in (text.find("\r", pos + 1), text.find("\n", pos + 1)) if i != -1),
                default=-1,
            )
            if newline != -1 and (close == -1 or newline < close):
                fail("CR or LF inside a quoted token", newline)
            if close == -1:
                fail("quoted token is never closed", pos)
            return close + 1
        end = bare(pos)
        if end == pos:
            char = text[pos]
            if char in ",;]":
                fail(f"{what} is empty (write '' for an empty text)", pos)
            fail(f"{what} cannot start with {_describe(char)}", pos)
        return end

    size = len(text)
    pos = 0
    if size == 0:
        fail("header is empty; a Command needs at least one key", 0)
    while True:
        end = bare(pos)
        if end == pos:
            fail(f"expected a key, found {_describe(text[pos])}", pos)
        if end == size:
            fail(f"key {text[pos:end]!r} has no '=' and value", end)
        if text[end] != "=":
            fail(f"expected '=' after key {text[pos:end]!r}, found {_describe(text[end])}", end)
        pos = end + 1
        if pos < size and text[pos] == "[":
            pos += 1
            if pos < size and text[pos] == "]":
                pos += 1
            else:
                while True:
                    pos = token(pos, "list item")
                    if pos == size:
                        fail("list is never closed with ']'", pos)
                    if text[pos] == "]":
                        pos += 1
                        break
                    if text[pos] != ",":
                        fail(f"expected ',' or ']' in a list, found {_describe(text[pos])}", pos)
                    pos += 1
        else:
            pos = token(pos, "value")
        if pos == size:
            break
        if text[pos] != ",":
            fail(f"expected ',' or ';' after a value, found {_describe(text[pos])}", pos)
        pos += 1
        if pos == size:
            fail("trailing ',' before the end of the header", pos - 1)
    # Reaching here means the scanner accepted what the regular expression
    # refused: a bug, never a client's fault, but still reported as a fault.
    raise ProtocolError("header refused by the grammar", offset=base)  # pragma: no cover


def _token(value: str) -> str:
    # Most values (ids, numbers) are alphanumeric: skip the regex for them.
    if value.isalnum() or (value and BARE_RE.fullmatch(value) is not None):
        return value
    return f"'{value}'"


def encode(command: Command, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Write one Command as one frame.

    Tokens are written bare when they can be and quoted otherwise; the "+"
    UTF-8 marker is written only when the header holds non-ASCII text.

    Raises:
        ProtocolError: the frame would break ``limits`` (the peer would refuse
            it). A Command's values are always carriable: Command refuses
            the others when it is built.
    """
    header = command.header
    if len(header) > limits.max_keys:
        raise TooManyKeys(
            f"header has {len(header)} keys, more than the limit of {limits.max_keys}"
        )
    parts = []
    for key, value in header.items():
        if type(value) is str:
            parts.append(f"{key}={_token(value)}")
        else:
            if len(value) > limits.max_list_items:
                raise TooManyListItems(
                    f"list of {key!r} has {len(value)} items, more than the limit of "
                    f"{limits.max_list_items}"
                )
            parts.append(f"{key}=[{','.join([_token(v) for v in value])}]")
    text = ",".join(parts)
    data = text.encode("ascii") if text.isascii() else b"+" + text.encode("utf-8")
    if len(data) > limits.max_header_bytes:
        raise HeaderTooLarge(
            f"header of {len(data)} bytes exceeds the limit of {limits.max_header_bytes}"
        )
    frame = data + b";" + command.body
    if len(frame) > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"frame of {len(frame)} bytes exceeds the limit of {limits.max_frame_bytes}"
        )
    return frame
