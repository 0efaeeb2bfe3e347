"""The shared codec test vectors: frames and what ``asbp`` makes of them.

``python -m tests.support.vectors > tests/vectors/frames.json`` writes the file
that both codecs are checked against: the Python one by
tests/asbp/test_vectors.py (which also fails when the file no longer matches
what this module generates), the TypeScript one in agents/js by
``node --test``. A vector is:

* ``valid``: a frame, its decoded header as ``[key, value]`` pairs in order
  (a value is a string, or a list of strings for a bracketed list), its body,
  and ``encoded``, the frame ``encode`` writes back for that Command;
* ``invalid``: a frame, the fault code ``decode`` raises and its byte offset;
* ``unencodable``: header pairs a Command refuses (or ``encode`` refuses
  under ``limits``), with the fault code.

Frames and bodies are JSON text when they are valid UTF-8 (``frame``,
``body``) and hex otherwise (``frame_hex``, ``body_hex``); a long frame is
``frame_repeat``, ``[prefix, unit, times, suffix]``, and its valid form gives
``body_length`` and ``encoded_length`` instead of the bytes. ``limits`` (the
``asbp.Limits`` fields) is present only where a vector uses other limits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, Final, NamedTuple

from asbp import Command, Limits, ProtocolError, decode, encode

__all__ = ["CASES", "UNENCODABLE", "Repeat", "vectors"]

_ID: Final = "0123456789abcdef0123456789abcdef"
_SMALL: Final = Limits(max_frame_bytes=64, max_header_bytes=32, max_keys=3, max_list_items=2)


class Repeat(NamedTuple):
    """A long frame written short: ``prefix``, ``unit`` ``times`` times, ``suffix``."""

    prefix: str
    unit: str
    times: int
    suffix: str

    def frame(self) -> bytes:
        return (self.prefix + self.unit * self.times + self.suffix).encode()


#: (frame, limits or None): each is decoded; the outcome says valid or not.
CASES: Final[tuple[tuple[bytes | Repeat, Limits | None], ...]] = tuple(
    (frame, None)
    for frame in (
        b"c=ping;",
        b"c=echo,u=1;hello",
        b"c=echo,u=65535;",
        b"c=echo,u=0;",
        b"c=echo,u=65536;",
        b"c=echo,u=01;",
        b"c=echo,u=-1;",
        b"c=echo,u=123456;",
        f"c=asbp.channel,i={_ID},b=broker-1;".encode(),
        f"c=x,d=[{_ID},{_ID}];".encode(),
        f"c=x,d={_ID};".encode(),
        b"c=x,d=[];",
        b"c=x,d=0123;",
        f"c=x,i={_ID.upper()};".encode(),
        f"c=x,i=[{_ID}];".encode(),
        f"c=x,s={_ID};body;with;semicolons".encode(),
        b"c=x,g=[a,b,'c d'];",
        b"c=x,g=[];",
        b"c=x,g='';",
        b"c='';",
        b"c=x,k='';",
        b"c=x,k=[];",
        b"c=x,k=['',''];",
        b"c='a;b',u=3;body",
        b"c='it''s';",
        b"c='unclosed;",
        b"c='line\nbreak';",
        b"c='cr\rx';",
        b"c=x,'k'=v;",
        b"c=x,k='v'w;",
        b"c=x,k=[a,b;",
        b"c=x,k=[a b];",
        b"c=x,k=[a,];",
        b"c=x,k=[,a];",
        b"c=x,k=[a]b;",
        b"c=x,,k=v;",
        b"c=x,;",
        b"c=x;",
        b",c=x;",
        b"=x;",
        b"c;",
        b"c=;",
        b"c=a b;",
        b"c=a\tb;",
        b"c=a\x00b;",
        b"c=a\x7fb;",
        b"c=x,k=v+w;",
        b"c=x+d=y;",
        b"c=x,c=y;",
        b"c=x,u=1,u=1;",
        b";",
        b"",
        b"c=x",
        b"no terminator at all",
        b"c=x,t=0,o=1;",
        b"c=x,t=123456789012345678901234567890;",
        b"c=x,o=0;",
        b"c=x,t=01;",
        b"c=x,f=1.3.6.1.4.1;",
        b"c=x,f=1;",
        b"c=x,m=text/plain;",
        b"c=x,m='text/plain; charset=UTF-8';",
        b"c=x,m=text;",
        b"c=x,e=UTF-8;",
        b"c=x,e='bad charset';",
        b"c=x,z=x-gzip;",
        b"c=x,z=application/x-gzip;",
        b"c=x,z=/;",
        b"c=x,p=alice*example.org;",
        b"c=x,p=alice@example.org;",
        b"c=x,r=[alice*example.org,bob*example.org];",
        b"c=x,r=[alice*example.org,bob];",
        b"c=x,a=agent;",
        b"c=x,a=[agent];",
        b"c=x,x=other;",
        b"c=x,b='';",
        b"c=x,o=[1,2];",
        "+c=caf\u00e9,u=2;".encode(),
        "+c=x,k='\u00fcber alles';\u00e9".encode(),
        "+c=\U0001f600;".encode(),
        "+c=x,k=a\u00a0b;".encode(),
        "+c=x,k=a\u3000b;".encode(),
        "+c=x,k=a\ufeffb;".encode(),
        "+c=x,k=a\u0085b;".encode(),
        "c=caf\u00e9;".encode(),
        "c=x,k='\u00e9';".encode(),
        b"+c=x\xff;",
        b"+c=x\xe2\x82;",
        b"+c=x\xed\xa0\x80;",
        b"+c=x\xc0\xaf;",
        b"+c=x\xf4\x90\x80\x80;",
        b"+;",
        b"++c=x;",
        b"c=x;\xff\xfe binary body \x00",
        b"c=x,u=1;\x80",
        b"c=x,k='a'';",
        b"c=x,k=[a,'b;c'];tail",
        b"c=x,k=['x',y,''];",
        b"c=x, k=v;",
        b"c=x ;",
        b"c=x,k=v\n;",
        b"c=]x;",
        b"c=x,k=[[a]];",
        b"c=x,k=v=w;",
        b"c=x,[k]=v;",
        b"c=x,k='v',j=[];",
        b"k1=v1,k2=v2,k3=v3,k4=v4,k5=v5,k6=v6,c=last;body",
        b"c=x,1=one,0=zero,10=ten;",
        b"c=asbp.fault,code=2101,e=UTF-8,u=9,cause=chat.send;no Command-Respondent",
        Repeat("c=x", ",k=v", 63, ";"),
        Repeat("c=x", ",k=v", 64, ";"),
        Repeat("c=x,k=[i", ",i", 1023, "];"),
        Repeat("c=x,k=[i", ",i", 1024, "];"),
        Repeat("c=", "n", 8 * 1024 - 2, ";"),
        Repeat("c=", "n", 8 * 1024 - 1, ";"),
        Repeat("c='", "n", 8 * 1024, "';"),
        Repeat("c=x;", "b", 256 * 1024 - 4, ""),
        Repeat("c=x;", "b", 256 * 1024 - 3, ""),
    )
) + tuple(
    (frame, _SMALL)
    for frame in (
        b"c=x,k=v;",
        b"c=x,k=v,j=w;",
        b"c=x,k=v,j=w,l=z;",
        b"c=x,k=[a,b];",
        b"c=x,k=[a,b,c];",
        b"c=" + b"n" * 30 + b";",
        b"c=" + b"n" * 31 + b";",
        b"c='" + b"n" * 40 + b"';",
        b"c='a';" + b"b" * 58,
        b"c='a';" + b"b" * 59,
        b"c=x,k=[a,b,c],j=v,l=w,m=u;",
    )
)

#: (header pairs, limits or None): Commands that cannot be built or written.
UNENCODABLE: Final[tuple[tuple[list[tuple[str, Any]], Limits | None], ...]] = (
    ([], None),
    ([("c", "it's")], None),
    ([("c", "a\nb")], None),
    ([("c", "a\rb")], None),
    ([("c", "")], None),
    ([("u", "65536")], None),
    ([("u", "x")], None),
    ([("i", "ABC")], None),
    ([("i", [_ID])], None),
    ([("d", [])], None),
    ([("k y", "v")], None),
    ([("", "v")], None),
    ([("k=", "v")], None),
    ([("c", "x"), ("k", ["a", "b", "c"])], _SMALL),
    ([("c", "x"), ("k", "v"), ("j", "w"), ("l", "z")], _SMALL),
    ([("c", "n" * 31)], _SMALL),
    ([("c", "'n")], _SMALL),
)


def _bytes_field(name: str, data: bytes) -> dict[str, str]:
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_hex": data.hex()}


def _pairs(command: Command) -> list[list[Any]]:
    return [[k, v if type(v) is str else list(v)] for k, v in command.header.items()]


def _limits(limits: Limits | None) -> dict[str, Any]:
    return {} if limits is None else {"limits": asdict(limits)}


def vectors() -> dict[str, Any]:
    """Every vector, as the JSON document written to tests/vectors/frames.json."""
    valid: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for case, limits in CASES:
        used = limits or Limits()
        entry: dict[str, Any]
        if isinstance(case, Repeat):
            frame = case.frame()
            entry = {"frame_repeat": list(case), **_limits(limits)}
        else:
            frame = case
            entry = {**_bytes_field("frame", frame), **_limits(limits)}
        try:
            command = decode(frame, limits=used)
        except ProtocolError as exc:
            invalid.append({**entry, "code": int(exc.code), "offset": exc.offset})
        else:
            encoded = encode(command, limits=used)
            valid.append(
                {
                    **entry,
                    "header": _pairs(command),
                    # Long bodies and re-encodings are checked by length only.
                    **(
                        _bytes_field("body", command.body)
                        if len(frame) < 4096
                        else {"body_length": len(command.body), "encoded_length": len(encoded)}
                    ),
                    **({} if len(frame) >= 4096 else _bytes_field("encoded", encoded)),
                }
            )
    unencodable: list[dict[str, Any]] = []
    for pairs, limits in UNENCODABLE:
        try:
            encode(Command(dict(pairs)), limits=limits or Limits())
        except ProtocolError as exc:
            unencodable.append(
                {"header": [list(p) for p in pairs], **_limits(limits), "code": int(exc.code)}
            )
        else:  # pragma: no cover - the table above is wrong
            raise AssertionError(f"{pairs!r} was encoded")
    return {"valid": valid, "invalid": invalid, "unencodable": unencodable}


def _lines() -> Iterator[str]:
    yield json.dumps(vectors(), indent=1, ensure_ascii=False)


if __name__ == "__main__":  # pragma: no cover
    for line in _lines():
        sys.stdout.write(line + "\n")
