"""Invalid frames, table-driven: each with its exact fault code and byte offset.

Every row names the problem the message must mention, so a refusal for the
wrong reason fails too. Offsets are byte offsets into the whole frame
(counting the "+" marker), never character offsets. The rows walk the
decoder in order: framing and sizes, text decoding, the grammar (each branch
of ``codec._diagnose``), limits, duplicates, then each reserved key's rule.
A second table holds near misses: frames that look wrong but are accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from asbp import (
    Command,
    FaultCode,
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    KiB,
    Limits,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
    decode,
)

UUID = "de305d5475b4431badb2eb6b9e546014"
U = UUID.encode()

BIG = FaultCode.INVALID_MESSAGE_SIZE  # 1101
LONG = FaultCode.HEADER_TOO_LARGE  # 1104
MANY = FaultCode.TOO_MANY_KEYS  # 1105
ITEMS = FaultCode.TOO_MANY_LIST_ITEMS  # 1106
F = FaultCode.INVALID_MESSAGE_FORMAT  # 1201
V = FaultCode.INVALID_HEADER_VALUE  # 1203

ERROR_CLASS = {
    FaultCode.INVALID_MESSAGE_SIZE: FrameTooLarge,
    FaultCode.HEADER_TOO_LARGE: HeaderTooLarge,
    FaultCode.TOO_MANY_KEYS: TooManyKeys,
    FaultCode.TOO_MANY_LIST_ITEMS: TooManyListItems,
    FaultCode.INVALID_MESSAGE_FORMAT: MalformedHeader,
    FaultCode.INVALID_HEADER_VALUE: InvalidHeaderValue,
}

SMALL = Limits(max_frame_bytes=16, max_header_bytes=8, max_keys=2, max_list_items=2)
KEYS2 = Limits(max_keys=2)
ITEMS2 = Limits(max_list_items=2)
KEYS65 = b",".join(b"k%d=%d" % (n, n) for n in range(65)) + b";"
ITEMS1025 = b"k=[" + b",".join([b"a"] * 1025) + b"];"


def bad(
    id: str,
    frame: bytes,
    code: FaultCode,
    offset: int,
    needle: str,
    limits: Limits | None = None,
    key: str | None = None,
) -> Any:
    return pytest.param(frame, code, offset, needle, limits, key, id=id)


def bad_value(id: str, frame: bytes, key: str, offset: int, needle: str) -> Any:
    """A reserved key's rule broken: 1203, and the error names the key."""
    return bad(id, frame, V, offset, needle, key=key)


FRAMING = [
    bad("empty-frame", b"", F, 0, "no ';' ends the header"),
    bad("no-terminator", b"c=x", F, 3, "no ';' ends the header"),
    bad("no-terminator-utf8", b"+c=\xc3\xa9", F, 5, "no ';' ends the header"),
    bad("only-marker", b"+", F, 1, "no ';' ends the header"),
    bad("unclosed-quote-no-terminator", b"c='x", F, 2, "quoted token is never closed"),
    bad("unclosed-quote-hides-terminator", b"c='x;body", F, 2, "quoted token is never closed"),
    bad("apostrophe-in-bare-token", b"c=it's;", F, 4, "quoted token is never closed"),
    bad("apostrophe-after-pairs", b"c=it's,k='x';", F, 11, "quoted token is never closed"),
    bad("quote-closed-in-body", b"c='x;body'", F, 10, "no ';' ends the header"),
    bad("quotes-hide-every-terminator", b"c='x;it's", F, 9, "no ';' ends the header"),
    bad("empty-header", b";", F, 0, "header is empty"),
    bad("empty-header-with-body", b";c=x;", F, 0, "header is empty"),
    bad("empty-header-after-marker", b"+;body", F, 1, "header is empty"),
]

SIZES = [
    bad("frame-over-limit", b"c=x;" + bytes(13), BIG, 16, "17 bytes", SMALL),
    bad("frame-over-limit-before-grammar", b"\xff" * 17, BIG, 16, "limit of 16", SMALL),
    bad("frame-over-default", b"c=x;" + bytes(256 * KiB - 3), BIG, 256 * KiB, "262145 bytes"),
    bad("header-over-limit", b"c=abcdefg;", LONG, 8, "limit of 8 bytes", SMALL),
    bad("header-over-limit-counts-marker", b"+c=abcdef;", LONG, 8, "limit of 8", SMALL),
    bad("header-over-limit-no-terminator", b"c=abcdefghijk", LONG, 8, "limit of 8", SMALL),
    bad("header-over-limit-quoted", b"c='abcde';", LONG, 8, "limit of 8", SMALL),
    bad("quote-closes-past-limit", b"c='abcdefgh';", LONG, 8, "limit of 8", SMALL),
    bad("quote-hides-terminator-past-limit", b"c='a;bcdefgh'", LONG, 8, "limit of 8", SMALL),
    bad("header-over-default", b"c=" + b"a" * (8 * KiB - 1) + b";", LONG, 8 * KiB, "of 8192 bytes"),
    bad("header-over-default-quoted", b"c='" + b"a" * 8189 + b"';", LONG, 8 * KiB, "of 8192"),
    bad("keys-over-limit", b"k1=1,k2=2,k3=3;", MANY, 10, "3 keys, more than the limit of 2", KEYS2),
    bad("keys-over-limit-utf8-offset", b"+\xc3\xa9=1,k=2,j=3;", MANY, 10, "3 keys", KEYS2),
    bad("keys-over-limit-before-duplicate", b"k=1,k=2,k=3;", MANY, 8, "3 keys", KEYS2),
    bad(
        "keys-over-default",
        KEYS65,
        MANY,
        KEYS65.index(b"k64"),
        "65 keys, more than the limit of 64",
    ),
    bad(
        "list-over-limit",
        b"k=[a,b,c];",
        ITEMS,
        0,
        "list of 'k' has 3 items, more than the limit of 2",
        ITEMS2,
    ),
    bad("list-over-limit-quoted", b"j=1,k=['',',',''];", ITEMS, 4, "3 items", ITEMS2),
    bad("list-over-default", ITEMS1025, ITEMS, 0, "1025 items, more than the limit of 1024"),
]

ENCODING = [
    bad("non-ascii-without-marker", b"c=\xc3\xa9;", F, 2, "byte 0xc3 is not ASCII"),
    bad("non-ascii-in-quotes-without-marker", b"c=x,k='\xff';", F, 7, "byte 0xff is not ASCII"),
    bad("non-ascii-key-without-marker", b"\xc3\xa9=1;", F, 0, "does not start with '+'"),
    bad("utf8-invalid-start-byte", b"+c=\xff;", F, 3, "not valid UTF-8 (invalid start byte)"),
    bad("utf8-truncated", b"+c=\xc3;", F, 3, "not valid UTF-8 (unexpected end of data)"),
    bad("utf8-truncated-in-quotes", b"+c='\xe2\x82';", F, 4, "not valid UTF-8"),
    bad("utf8-bad-continuation", b"+c=\xc3(;", F, 3, "invalid continuation byte"),
    bad("utf8-surrogate", b"+c='\xed\xa0\x80';", F, 4, "not valid UTF-8"),
    bad("utf8-overlong", b"+c=\xc0\xaf;", F, 3, "not valid UTF-8"),
    bad("utf8-after-multibyte", b"+k=\xc3\xa9\xff;", F, 5, "not valid UTF-8"),
]

KEYS = [
    bad("key-missing", b"=x;", F, 0, "expected a key, found reserved character '='"),
    bad("key-starts-with-comma", b",c=x;", F, 0, "expected a key, found reserved character ','"),
    bad("key-starts-with-bracket", b"[c]=x;", F, 0, "expected a key, found reserved character '['"),
    bad("key-starts-with-close-bracket", b"]=x;", F, 0, "reserved character ']'"),
    bad("key-quoted", b"'c'=x;", F, 0, 'expected a key, found reserved character "\'"'),
    bad("key-starts-with-space", b" c=x;", F, 0, "expected a key, found whitespace U+0020"),
    bad("key-after-comma-tab", b"c=x,\tk=y;", F, 4, "whitespace U+0009"),
    bad("key-starts-with-control", b"\x01c=x;", F, 0, "control character U+0001"),
    bad("key-starts-with-nul", b"\x00c=x;", F, 0, "control character U+0000"),
    bad("key-starts-with-del", b"\x7fc=x;", F, 0, "control character U+007F"),
    bad("key-starts-with-c1", b"+\xc2\x80c=x;", F, 1, "control character U+0080"),
    bad("key-starts-with-c1-last", b"+\xc2\x9fc=x;", F, 1, "control character U+009F"),
    bad("key-starts-with-nel", b"+\xc2\x85c=x;", F, 1, "whitespace U+0085"),
    bad("key-starts-with-nbsp", b"+\xc2\xa0c=x;", F, 1, "whitespace U+00A0"),
    bad("key-starts-with-line-separator", b"+c=x,\xe2\x80\xa8k=y;", F, 5, "whitespace U+2028"),
    bad("key-starts-with-file-separator", b"\x1cc=x;", F, 0, "whitespace U+001C"),
    bad(
        "key-then-ideographic-space",
        b"+k\xe3\x80\x80=x;",
        F,
        2,
        "expected '=' after key 'k', found whitespace U+3000",
    ),
    bad("key-then-space", b"c =x;", F, 1, "expected '=' after key 'c', found whitespace U+0020"),
    bad(
        "key-then-comma",
        b"c,d=x;",
        F,
        1,
        "expected '=' after key 'c', found reserved character ','",
    ),
    bad("key-then-bracket", b"c[0]=x;", F, 1, "found reserved character '['"),
    bad("key-then-quote", b"c'x'=y;", F, 1, 'found reserved character "\'"'),
    bad("key-without-value", b"c;", F, 1, "key 'c' has no '=' and value"),
    bad("second-key-without-value", b"c=x,kk;", F, 6, "key 'kk' has no '=' and value"),
    bad(
        "marker-mid-header", b"c=x,+k=y;", F, 4, "'+' (the UTF-8 marker may only be the first byte"
    ),
    bad("marker-twice", b"++c=x;", F, 1, "UTF-8 marker"),
    bad("marker-inside-key", b"c+d=x;", F, 1, "expected '=' after key 'c', found '+'"),
    bad("marker-after-utf8", b"+\xc3\xa9=1,+k=2;", F, 6, "UTF-8 marker"),
    bad(
        "empty-key-between-commas",
        b"c=x,,k=y;",
        F,
        4,
        "expected a key, found reserved character ','",
    ),
    bad("trailing-comma", b"c=x,;", F, 3, "trailing ','"),
    bad("trailing-comma-utf8", b"+c=\xc3\xa9,;", F, 5, "trailing ','"),
]

VALUES = [
    bad("value-missing-at-end", b"c=;", F, 2, "value is missing before the end of the header"),
    bad(
        "value-empty-before-comma", b"c=,k=y;", F, 2, "value is empty (write '' for an empty text)"
    ),
    bad("value-empty-before-bracket", b"c=]x;", F, 2, "value is empty"),
    bad(
        "value-starts-with-equals", b"c==x;", F, 2, "value cannot start with reserved character '='"
    ),
    bad("value-starts-with-marker", b"c=+x;", F, 2, "value cannot start with '+'"),
    bad("value-starts-with-space", b"c= x;", F, 2, "value cannot start with whitespace U+0020"),
    bad(
        "value-starts-with-control",
        b"c=\x1bx;",
        F,
        2,
        "value cannot start with control character U+001B",
    ),
    bad(
        "value-holds-space",
        b"c=a b;",
        F,
        3,
        "expected ',' or ';' after a value, found whitespace U+0020",
    ),
    bad("value-holds-equals", b"c=a=b;", F, 3, "found reserved character '='"),
    bad("value-holds-plus", b"c=1+1;", F, 3, "found '+'"),
    bad("value-holds-bracket", b"c=a[0];", F, 3, "found reserved character '['"),
    bad("value-holds-nul", b"c=a\x00b;", F, 3, "found control character U+0000"),
    bad("value-holds-c1", b"+c=a\xc2\x9b;", F, 4, "found control character U+009B"),
    bad("value-holds-em-space-utf8-offset", b"+c=\xc3\xa9\xe2\x80\x83;", F, 5, "whitespace U+2003"),
    bad(
        "quoted-then-quoted",
        b"c='a''b';",
        F,
        5,
        "expected ',' or ';' after a value, found reserved character \"'\"",
    ),
    bad("quoted-then-space", b"c='a' ;", F, 5, "found whitespace U+0020"),
    bad("quoted-holds-cr", b"c='a\rb';", F, 4, "CR or LF inside a quoted token"),
    bad("quoted-holds-lf", b"c='a\nb';", F, 4, "CR or LF inside a quoted token"),
    bad("quoted-holds-crlf-utf8-offset", b"+c='\xc3\xa9\r\n';", F, 6, "CR or LF"),
    bad("second-quoted-holds-lf", b"c='a',k='\n';", F, 9, "CR or LF"),
    bad("lf-after-quoted-value", b"c='a'\n;", F, 5, "found whitespace U+000A"),
]

LISTS = [
    bad("list-nested", b"k=[[a]];", F, 3, "list item cannot start with reserved character '['"),
    bad("list-never-closed", b"k=[a;", F, 4, "list is never closed with ']'"),
    bad("list-never-closed-after-quoted", b"k=['a';", F, 6, "list is never closed with ']'"),
    bad(
        "list-open-bracket-only", b"k=[;", F, 3, "list item is missing before the end of the header"
    ),
    bad("list-missing-item-at-end", b"k=[a,;", F, 5, "list item is missing before the end"),
    bad(
        "list-empty-last-item", b"k=[a,];", F, 5, "list item is empty (write '' for an empty text)"
    ),
    bad("list-empty-first-item", b"k=[,a];", F, 3, "list item is empty"),
    bad("list-empty-middle-item", b"k=[a,,b];", F, 5, "list item is empty"),
    bad(
        "list-item-starts-with-space",
        b"k=[a, b];",
        F,
        5,
        "list item cannot start with whitespace U+0020",
    ),
    bad("list-item-starts-with-marker", b"k=[+a];", F, 3, "list item cannot start with '+'"),
    bad(
        "list-item-starts-with-control",
        b"k=[\x00];",
        F,
        3,
        "list item cannot start with control character U+0000",
    ),
    bad(
        "list-item-then-space",
        b"k=[a ,b];",
        F,
        4,
        "expected ',' or ']' in a list, found whitespace U+0020",
    ),
    bad(
        "list-item-holds-equals",
        b"k=[a=b];",
        F,
        4,
        "expected ',' or ']' in a list, found reserved character '='",
    ),
    bad(
        "list-quoted-then-quoted",
        b"k=['a''b'];",
        F,
        6,
        "expected ',' or ']' in a list, found reserved character \"'\"",
    ),
    bad("list-item-holds-cr", b"k=['a','b\r'];", F, 9, "CR or LF inside a quoted token"),
    bad(
        "list-then-list",
        b"k=[a][b];",
        F,
        5,
        "expected ',' or ';' after a value, found reserved character '['",
    ),
    bad("list-double-close", b"k=[]];", F, 4, "found reserved character ']'"),
    bad("list-empty-then-trailing-comma", b"k=[],;", F, 4, "trailing ','"),
    bad(
        "list-bracket-as-key", b"k=[a],[b]=c;", F, 6, "expected a key, found reserved character '['"
    ),
]

DUPLICATES = [
    bad("duplicate-key", b"k=1,k=2;", F, 4, "duplicate key 'k'"),
    bad("duplicate-key-later", b"c=x,k=1,c=y;", F, 8, "duplicate key 'c'"),
    bad("duplicate-key-same-value-other-form", b"k=1,k='1';", F, 4, "duplicate key 'k'"),
    bad("duplicate-key-list", b"k=[],k=[];", F, 5, "duplicate key 'k'"),
    bad("duplicate-key-utf8-offset", b"+\xc3\xa9=1,\xc3\xa9=2;", F, 6, "duplicate key '\xe9'"),
    bad("duplicate-before-bad-value", b"k=1,k=2,u=x;", F, 4, "duplicate key 'k'"),
]

RESERVED = [
    # a, b, c, x: one non-empty text.
    bad_value("a-empty", b"a='';", "a", 0, "must not be empty"),
    bad_value("a-single-item-list", b"a=[x];", "a", 0, "takes a single value, not a list"),
    bad_value("a-empty-list", b"a=[];", "a", 0, "takes a single value, not a list"),
    bad_value("b-empty", b"k=v,b='';", "b", 4, "must not be empty"),
    bad_value("b-list", b"b=[x,y];", "b", 0, "takes a single value"),
    bad_value("c-empty", b"c='';", "c", 0, "must not be empty"),
    bad_value("c-list", b"c=['display text'];", "c", 0, "takes a single value"),
    bad_value("x-empty", b"x='';", "x", 0, "must not be empty"),
    bad_value("x-list", b"x=[1.3.6];", "x", 0, "takes a single value"),
    # d: one or more Channel-Identifiers.
    bad_value(
        "d-uppercase",
        b"d=" + UUID.upper().encode() + b";",
        "d",
        0,
        "must be a UUID as 32 lowercase hex digits",
    ),
    bad_value("d-31-digits", b"d=" + U[:31] + b";", "d", 0, "32 lowercase hex"),
    bad_value("d-33-digits", b"d=" + U + b"0;", "d", 0, "32 lowercase hex"),
    bad_value("d-dashes", b"d=de305d54-75b4-431b-adb2-eb6b9e546014;", "d", 0, "without dashes"),
    bad_value("d-not-hex", b"d=" + U[:31] + b"g;", "d", 0, "UUID"),
    bad_value("d-empty", b"d='';", "d", 0, "UUID"),
    bad_value("d-empty-list", b"d=[];", "d", 0, "takes one or more values, not an empty list"),
    bad_value("d-list-bad-item", b"d=[" + U + b",x];", "d", 0, "UUID"),
    bad_value("d-list-empty-item", b"d=[''];", "d", 0, "UUID"),
    # e: a charset name.
    bad_value("e-empty", b"e='';", "e", 0, "must be a charset name"),
    bad_value("e-space", b"e='UTF 8';", "e", 0, "charset name"),
    bad_value("e-65-chars", b"e=" + b"a" * 65 + b";", "e", 0, "charset name"),
    bad_value("e-slash", b"e=text/plain;", "e", 0, "charset name"),
    bad_value("e-list", b"e=[UTF-8];", "e", 0, "takes a single value"),
    # f: an OID.
    bad_value("f-one-arc", b"f=1;", "f", 0, "must be an OID"),
    bad_value("f-leading-zero", b"f=01.3;", "f", 0, "OID"),
    bad_value("f-empty-arc", b"f=1..3;", "f", 0, "OID"),
    bad_value("f-trailing-dot", b"f=1.3.;", "f", 0, "OID"),
    bad_value("f-letters", b"f=1.a;", "f", 0, "OID"),
    bad_value("f-empty", b"f='';", "f", 0, "OID"),
    bad_value("f-list", b"f=[1.3];", "f", 0, "takes a single value"),
    # g: one or more non-empty group names.
    bad_value("g-empty", b"g='';", "g", 0, "must not be empty"),
    bad_value("g-empty-list", b"g=[];", "g", 0, "not an empty list"),
    bad_value("g-list-empty-item", b"g=[friends,''];", "g", 0, "must not be empty"),
    # i, s: one Channel- or Subject-Identifier.
    bad_value("i-uppercase", b"i=" + UUID.upper().encode() + b";", "i", 0, "UUID"),
    bad_value("i-list", b"i=[" + U + b"];", "i", 0, "takes a single value"),
    bad_value("i-empty", b"i='';", "i", 0, "UUID"),
    bad_value("s-short", b"s=" + U[:-1] + b";", "s", 0, "UUID"),
    bad_value("s-list", b"s=[" + U + b"];", "s", 0, "takes a single value"),
    # o: one-based, any size; t: from zero, any size.
    bad_value("o-zero", b"o=0;", "o", 0, "one-based unsigned integer"),
    bad_value("o-leading-zero", b"o=01;", "o", 0, "without leading zeros"),
    bad_value("o-negative", b"o=-1;", "o", 0, "one-based"),
    bad_value("o-fraction", b"o=1.5;", "o", 0, "one-based"),
    bad_value("o-empty", b"o='';", "o", 0, "one-based"),
    bad_value("o-list", b"o=[1];", "o", 0, "takes a single value"),
    bad_value("o-non-ascii-digit", "+o=\u0663;".encode(), "o", 1, "one-based"),
    bad_value("t-leading-zero", b"t=00;", "t", 0, "unsigned integer without leading zeros"),
    bad_value("t-negative-zero", b"t=-0;", "t", 0, "unsigned integer"),
    bad_value("t-signed", b"t='+1';", "t", 0, "unsigned integer"),
    bad_value("t-empty", b"t='';", "t", 0, "unsigned integer"),
    bad_value("t-list", b"t=[0];", "t", 0, "takes a single value"),
    # u: 0..65535 (the draft's "65,563" read as 65,535).
    bad_value("u-65536", b"u=65536;", "u", 0, "from 0 to 65535"),
    bad_value("u-65563", b"u=65563;", "u", 0, "from 0 to 65535"),
    bad_value("u-99999", b"u=99999;", "u", 0, "from 0 to 65535"),
    bad_value("u-six-digits", b"u=100000;", "u", 0, "from 0 to 65535"),
    bad_value("u-leading-zero", b"u=065;", "u", 0, "without leading zeros"),
    bad_value("u-double-zero", b"u=00;", "u", 0, "from 0 to 65535"),
    bad_value("u-negative", b"u=-1;", "u", 0, "from 0 to 65535"),
    bad_value("u-exponent", b"u=1e3;", "u", 0, "from 0 to 65535"),
    bad_value("u-empty", b"u='';", "u", 0, "from 0 to 65535"),
    bad_value("u-list", b"u=[1];", "u", 0, "takes a single value"),
    bad_value("u-non-ascii-digit", "+u=\u0663;".encode(), "u", 1, "from 0 to 65535"),
    bad_value("u-offset-after-utf8", "+k='\xe9',u=x;".encode(), "u", 8, "from 0 to 65535"),
    # m: a MIME type.
    bad_value("m-no-subtype", b"m=text;", "m", 0, "must be a MIME type"),
    bad_value("m-no-type", b"m=/plain;", "m", 0, "MIME type"),
    bad_value("m-space-in-type", b"m='text /plain';", "m", 0, "MIME type"),
    bad_value("m-empty", b"m='';", "m", 0, "MIME type"),
    bad_value("m-list", b"m=[text/plain];", "m", 0, "takes a single value"),
    # r: one or more Conversation-Addresses; p: one.
    bad_value("r-no-star", b"r=bob;", "r", 0, "must be a Conversation-Address"),
    bad_value("r-no-local", b"r=*example.org;", "r", 0, "Conversation-Address"),
    bad_value("r-no-domain", b"r=bob*;", "r", 0, "Conversation-Address"),
    bad_value("r-two-stars", b"r=a*b*c;", "r", 0, "Conversation-Address"),
    bad_value("r-at-sign", b"r=bob@example.org;", "r", 0, "Conversation-Address"),
    bad_value("r-space", b"r='bob *example.org';", "r", 0, "Conversation-Address"),
    bad_value("r-control", b"r='bob\x01*example.org';", "r", 0, "Conversation-Address"),
    bad_value("r-empty-list", b"r=[];", "r", 0, "not an empty list"),
    bad_value("r-list-bad-item", b"r=[a*b,c];", "r", 0, "Conversation-Address"),
    bad_value("p-list", b"p=[bob*example.org];", "p", 0, "takes a single value"),
    bad_value("p-no-star", b"p=bob;", "p", 0, "Conversation-Address"),
    # z: a compression MIME type, or the part after "application/".
    bad_value("z-empty", b"z='';", "z", 0, "MIME type or its part after 'application/'"),
    bad_value("z-two-slashes", b"z=a/b/c;", "z", 0, "MIME type"),
    bad_value("z-space", b"z='x gzip';", "z", 0, "MIME type"),
    bad_value("z-list", b"z=[x-gzip];", "z", 0, "takes a single value"),
    # Order of checks: the first broken pair is reported.
    bad_value("bad-value-before-duplicate", b"u=x,k=1,k=2;", "u", 0, "from 0 to 65535"),
]

CASES = FRAMING + SIZES + ENCODING + KEYS + VALUES + LISTS + DUPLICATES + RESERVED


@pytest.mark.parametrize(("frame", "code", "offset", "needle", "limits", "key"), CASES)
def test_invalid_frame(
    frame: bytes,
    code: FaultCode,
    offset: int,
    needle: str,
    limits: Limits | None,
    key: str | None,
) -> None:
    with pytest.raises(ProtocolError) as info:
        if limits is None:
            decode(frame)
        else:
            decode(frame, limits=limits)
    error = info.value
    assert (error.code, error.offset) == (code, offset), error.message
    assert type(error) is ERROR_CLASS[code]
    assert needle in error.message
    assert error.message.endswith(f" at byte {offset}")
    assert str(error) == f"{int(code)}: {error.message}"
    if key is not None:
        assert isinstance(error, InvalidHeaderValue)
        assert error.key == key
        assert error.message.startswith(f"key {key!r}: ")


def test_invalid_frame_as_bytearray_and_memoryview() -> None:
    for frame in (bytearray(b"c=x,k=1,k=2;"), memoryview(b"c=x,k=1,k=2;")):
        with pytest.raises(MalformedHeader) as info:
            decode(frame)
        assert info.value.offset == 8


# -- near misses: accepted, and read as shown ----------------------------------


def ok(id: str, frame: bytes, header: dict[str, Any], body: bytes = b"") -> Any:
    return pytest.param(frame, header, body, id=id)


NEAR_MISSES = [
    ok("semicolon-inside-quotes", b"c=';';", {"c": ";"}),
    ok("semicolons-in-quotes-and-body", b"c='a;b';x;y", {"c": "a;b"}, b"x;y"),
    ok("quote-in-body", b"c=x;it's", {"c": "x"}, b"it's"),
    ok("unclosed-quote-in-body", b"c='a';'", {"c": "a"}, b"'"),
    ok("binary-body", b"c=x;\xff\x00;\r\n", {"c": "x"}, b"\xff\x00;\r\n"),
    ok("empty-quoted", b"k='';", {"k": ""}),
    ok("empty-list-unknown-key", b"k=[];", {"k": ()}),
    ok("empty-list-uppercase-key", b"D=[];", {"D": ()}),
    ok("list-of-empty", b"k=[''];", {"k": ("",)}),
    ok("list-of-two-empty", b"k=['',''];", {"k": ("", "")}),
    ok("list-mixed", b"k=[a,'b,c',d];", {"k": ("a", "b,c", "d")}),
    ok("brackets-in-quotes", b"k='[a]';", {"k": "[a]"}),
    ok("reserved-in-quotes", b"k=';=,[]+';", {"k": ";=,[]+"}),
    ok("whitespace-in-quotes", b"k=' \t\x0b\x0c ';", {"k": " \t\x0b\x0c "}),
    ok("controls-in-quotes", b"k='\x00\x1b\x7f';", {"k": "\x00\x1b\x7f"}),
    ok("c1-in-quotes", b"+k='\xc2\x85\xc2\x9f';", {"k": "\x85\x9f"}),
    ok("marker-on-ascii-header", b"+c=x;", {"c": "x"}),
    ok(
        "utf8-bare",
        "+\u043a\u043b\u044e\u0447=\xe9\u00e8;".encode(),
        {"\u043a\u043b\u044e\u0447": "\xe9\xe8"},
    ),
    ok("utf8-bom-is-not-whitespace", b"+\xef\xbb\xbfk=x;", {"\ufeffk": "x"}),
    ok(
        "unknown-keys-carried",
        b"zz=1,A=[x],long-key='';",
        {"zz": "1", "A": ("x",), "long-key": ""},
    ),
    ok("dash-dot-star-bare", b"k=a-b.c*d/e:f;", {"k": "a-b.c*d/e:f"}),
    ok("negative-number-unknown-key", b"k=-1;", {"k": "-1"}),
    ok("a-any-text", b"a='Agent 007';", {"a": "Agent 007"}),
    ok("d-single-item-list", b"d=[" + U + b"];", {"d": (UUID,)}),
    ok("d-two-items", b"d=[" + U + b"," + U[::-1] + b"];", {"d": (UUID, UUID[::-1])}),
    ok("g-single", b"g=friends;", {"g": "friends"}),
    ok("e-registered-name", b"e=ISO_8859-1:1987;", {"e": "ISO_8859-1:1987"}),
    ok("e-64-chars", b"e=" + b"a" * 64 + b";", {"e": "a" * 64}),
    ok("f-oid", b"f=1.3.6.1.4.1.0;", {"f": "1.3.6.1.4.1.0"}),
    ok("m-with-parameters", b"m='text/plain; charset=UTF-8';", {"m": "text/plain; charset=UTF-8"}),
    ok("m-plus-suffix-quoted", b"m='application/atom+xml';", {"m": "application/atom+xml"}),
    ok("o-one", b"o=1;", {"o": "1"}),
    ok("t-zero", b"t=0;", {"t": "0"}),
    ok("u-zero", b"u=0;", {"u": "0"}),
    ok("u-65535", b"u=65535;", {"u": "65535"}),
    ok("r-quoted-comma", b"r='bob*ex,ample.org';", {"r": "bob*ex,ample.org"}),
    ok("r-list", b"r=[a*b,c*d];", {"r": ("a*b", "c*d")}),
    ok("p-unicode", "+p=\u00e9*\u00e8.fr;".encode(), {"p": "\xe9*\xe8.fr"}),
    ok("z-abbreviated", b"z=x-gzip;", {"z": "x-gzip"}),
    ok("z-full", b"z=application/x-bzip2;", {"z": "application/x-bzip2"}),
]


@pytest.mark.parametrize(("frame", "header", "body"), NEAR_MISSES)
def test_near_miss_is_accepted(frame: bytes, header: dict[str, Any], body: bytes) -> None:
    command = decode(frame)
    assert dict(command.header) == header
    assert list(command.header) == list(header)
    assert command.body == body
    assert command == Command(header, body)


# -- limits: inclusive at the limit, refused one past it ----------------------


def _header_of(size: int) -> bytes:
    """A valid header of exactly ``size`` bytes (size >= 3)."""
    return b"c=" + b"a" * (size - 2)


@pytest.mark.parametrize("limits", [SMALL, Limits(), Limits(max_header_bytes=100)])
def test_header_limit_is_inclusive(limits: Limits) -> None:
    size = limits.max_header_bytes
    body_room = limits.max_frame_bytes - size - 1
    assert decode(_header_of(size) + b";", limits=limits).name == "a" * (size - 2)
    quoted = b"c='" + b"a" * (size - 4) + b"'"
    assert len(quoted) == size
    assert decode(quoted + b";" + b"x" * body_room, limits=limits).name == "a" * (size - 4)
    with pytest.raises(HeaderTooLarge) as info:
        decode(_header_of(size + 1) + b";", limits=limits)
    assert info.value.offset == size


def test_frame_limit_is_inclusive() -> None:
    for limits in (SMALL, Limits()):
        frame = b"c=x;" + b"\x00" * (limits.max_frame_bytes - 4)
        assert decode(frame, limits=limits).body == frame[4:]
        with pytest.raises(FrameTooLarge) as info:
            decode(frame + b"\x00", limits=limits)
        assert info.value.offset == limits.max_frame_bytes


def test_key_limit_is_inclusive() -> None:
    for limits in (SMALL, Limits()):
        keys = [f"k{n}" for n in range(limits.max_keys + 1)]
        big = Limits(max_header_bytes=64 * KiB, max_keys=limits.max_keys)
        at = ",".join(f"{k}=1" for k in keys[:-1]).encode() + b";"
        assert list(decode(at, limits=big).header) == keys[:-1]
        over = ",".join(f"{k}=1" for k in keys).encode() + b";"
        with pytest.raises(TooManyKeys) as info:
            decode(over, limits=big)
        assert info.value.offset == over.index(f",{keys[-1]}=".encode()) + 1


def test_list_limit_is_inclusive() -> None:
    for limits in (SMALL, Limits()):
        big = Limits(max_header_bytes=64 * KiB, max_list_items=limits.max_list_items)
        n = limits.max_list_items
        at = b"c=x,k=[" + b",".join([b"''"] * n) + b"];"
        assert decode(at, limits=big).get("k") == ("",) * n
        over = b"c=x,k=[" + b",".join([b"''"] * (n + 1)) + b"];"
        with pytest.raises(TooManyListItems) as info:
            decode(over, limits=big)
        assert info.value.offset == 4


def test_limits_apply_per_call() -> None:
    frame = b"k1=1,k2=2,k3=3;"
    assert len(decode(frame).header) == 3
    with pytest.raises(TooManyKeys):
        decode(frame, limits=KEYS2)
    assert len(decode(frame).header) == 3


def test_frame_without_terminator_just_over_header_limit_is_header_too_large() -> None:
    """A frame of max_header_bytes + 1 bytes with no ";" holds no terminator
    within the limit (HeaderTooLarge's own definition), like every longer one.

    (This length alone was once reported as 1201 past the limit.)
    """
    for size in (9, 10, 16):  # 16: SMALL's frame limit; past it, 1101 comes first
        frame = _header_of(size)
        with pytest.raises(HeaderTooLarge) as info:
            decode(frame, limits=SMALL)
        assert info.value.offset == 8, size


@pytest.mark.parametrize(
    ("frame", "offset", "char"),
    [
        (b"c='a'b;", 5, "b"),
        (b"k=[a]b;", 5, "b"),
        (b"k=[]x;", 4, "x"),
        (b"k=['a'b];", 6, "b"),
        ("+c='a'\xe9;".encode(), 6, "\xe9"),
    ],
    ids=["after-quoted", "after-list", "after-empty-list", "in-list-after-quoted", "utf8"],
)
def test_bare_char_after_quote_or_bracket_is_not_called_a_control(
    frame: bytes, offset: int, char: str
) -> None:
    """An ordinary character right after a closing quote or bracket is named as
    itself, not described as a "control character"."""
    with pytest.raises(MalformedHeader) as info:
        decode(frame)
    assert info.value.offset == offset
    assert "control" not in info.value.message
    assert repr(char) in info.value.message or f"U+{ord(char):04X}" in info.value.message


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_oversized_bytes_like_frames_are_refused_before_copying(kind: type) -> None:
    with pytest.raises(FrameTooLarge) as info:
        decode(kind(b"c=a;" + b"x" * 20), limits=SMALL)
    assert info.value.offset == SMALL.max_frame_bytes


def test_limits_beyond_a_c_integer_are_no_limit() -> None:
    huge = Limits(max_header_bytes=2**63, max_frame_bytes=2**64)
    assert decode(b"c='a;b';x", limits=huge).name == "a;b"
