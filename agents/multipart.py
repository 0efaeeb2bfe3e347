"""A strict reader for the broker's long-poll responses (``multipart/mixed``).

Sans-I/O: bytes in, ``(seq, frame)`` pairs out. It reads exactly what
``gateway.transports.http`` writes (docs/protocol.md, "Stateless HTTP
Channels"), which is RFC 2046 §5.1 narrowed down::

    body      = 1*part close-delimiter
    part      = "--" boundary CRLF *header CRLF content CRLF
    header    = name ":" *SP value CRLF        ; Content-Type, Content-Length, ASBP-Seq
    content   = Content-Length octets          ; one Command
    close-delimiter = "--" boundary "--" [CRLF]

Every part must carry ``Content-Type: application/asbp``, a
``Content-Length`` (the content is taken by length, never by scanning for
the boundary, so a body may hold any bytes) and an ``ASBP-Seq``. Anything
else, a preamble, an epilogue, or a part's header block longer than
:data:`MAX_PART_HEADER_BYTES`, is refused with :class:`MultipartError`.
The caller bounds the whole body before it gets here.
"""

from __future__ import annotations

import re
from typing import Final

from agents.errors import AgentError

__all__ = ["MAX_PART_HEADER_BYTES", "MEDIA_TYPE", "MultipartError", "boundary_of", "parse_parts"]

#: The media type of one Command.
MEDIA_TYPE: Final = "application/asbp"
#: The longest header block one part may have, CRLFs included.
MAX_PART_HEADER_BYTES: Final = 1024

_CRLF: Final = b"\r\n"
# RFC 2046 §5.1.1: 1 to 70 characters from bcharsnospace (we do not accept
# spaces, which the broker never sends).
_BOUNDARY: Final = re.compile(r"[0-9A-Za-z'()+_,\-./:=?]{1,70}")
_MULTIPART: Final = re.compile(
    r'\s*multipart/mixed\s*;\s*boundary\s*=\s*(?:"([^"]*)"|([^\s;"]+))\s*(?:;.*)?',
    re.IGNORECASE | re.DOTALL,
)
_DIGITS: Final = re.compile(rb"0|[1-9][0-9]{0,17}")


class MultipartError(AgentError):
    """A long-poll response that is not what the broker writes."""


def boundary_of(content_type: str) -> str:
    """The boundary parameter of a ``multipart/mixed`` Content-Type.

    Raises:
        MultipartError: not ``multipart/mixed``, or no valid boundary.
    """
    match = _MULTIPART.fullmatch(content_type)
    if match is None:
        raise MultipartError(f"expected multipart/mixed with a boundary, got {content_type!r}")
    boundary = match.group(1) if match.group(1) is not None else match.group(2)
    if _BOUNDARY.fullmatch(boundary) is None:
        raise MultipartError(f"invalid multipart boundary {boundary!r}")
    return boundary


def parse_parts(body: bytes, boundary: str, *, max_parts: int = 4096) -> list[tuple[int, bytes]]:
    """Split a long-poll body into ``(ASBP-Seq, frame)`` pairs, in order.

    Raises:
        MultipartError: anything that breaks the grammar in the module docstring.
    """
    delimiter = b"--" + boundary.encode("ascii")
    parts: list[tuple[int, bytes]] = []
    position = 0
    while True:
        if not body.startswith(delimiter, position):
            raise MultipartError(f"expected the boundary at byte {position}")
        position += len(delimiter)
        if body.startswith(b"--", position):
            position += 2
            if body[position:] not in (b"", _CRLF):
                raise MultipartError("data after the closing boundary")
            return parts
        if not body.startswith(_CRLF, position):
            raise MultipartError(f"expected CRLF after the boundary at byte {position}")
        position += 2
        if len(parts) >= max_parts:
            raise MultipartError(f"more than {max_parts} parts")
        end = body.find(_CRLF + _CRLF, position - 2, position + MAX_PART_HEADER_BYTES)
        if end < 0:
            raise MultipartError(f"a part header block at byte {position} is unterminated or long")
        headers = _headers(body[position:end]) if end >= position else {}
        position = end + 4
        length = _number(headers, b"content-length")
        seq = _number(headers, b"asbp-seq")
        content_type = headers.get(b"content-type")
        if content_type is None or content_type.strip().lower() != MEDIA_TYPE.encode():
            raise MultipartError(f"a part is not {MEDIA_TYPE}: {content_type!r}")
        if position + length + 2 > len(body):
            raise MultipartError("a part is shorter than its Content-Length")
        frame = body[position : position + length]
        position += length
        if not body.startswith(_CRLF, position):
            raise MultipartError(f"expected CRLF after a part's content at byte {position}")
        position += 2
        parts.append((seq, frame))


def _headers(block: bytes) -> dict[bytes, bytes]:
    headers: dict[bytes, bytes] = {}
    for line in block.split(_CRLF):
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or not name or name != name.strip() or name in headers:
            raise MultipartError(f"bad part header line {line[:80]!r}")
        headers[name] = value.strip(b" \t")
    return headers


def _number(headers: dict[bytes, bytes], name: bytes) -> int:
    value = headers.get(name)
    if value is None or _DIGITS.fullmatch(value) is None:
        raise MultipartError(f"a part needs a numeric {name.decode()!r} header, got {value!r}")
    return int(value)
