"""Command: one ASBP message, a validated header and an opaque body.

A Command validates itself on construction, so an invalid Command cannot
exist: every key is a bare token, every value can be carried by some header
(no "'", CR, LF or lone surrogate), and reserved keys obey section 1.3.4.2.
That makes ``encode`` total up to the size limits, and lets the router trust
what it holds.

Commands are immutable. The broker derives copies with ``with_keys`` (to add
``i``, ``s`` and ``b``), ``without_keys`` and ``with_body``; only the keys that
change are validated again.

Every inbound frame becomes a Command, so building one from values that are
already valid (``_trusted``) is kept cheap: the header is stored as the plain
dict the caller hands over (the Command owns it and never mutates it), the
slots are filled through their descriptors rather than ``object.__setattr__``,
and the read-only ``MappingProxyType`` view is made only when ``header`` is
read. Nothing outside this module ever sees the dict itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Any, Final, NoReturn, cast

from asbp.errors import InvalidHeaderValue, MalformedHeader
from asbp.grammar import BARE_RE, UNCARRIABLE_RE
from asbp.header import (
    ApplicationAgentId,
    ChannelId,
    ConversationAddress,
    HeaderValue,
    SubjectId,
    check_value,
    format_uint,
    parse_uint,
)

__all__ = ["Command", "HeaderInput"]

#: What callers may pass for a value: text, a whole number (written in
#: decimal), or a sequence of texts for a bracketed list.
HeaderInput = str | int | Iterable[str]

_BODY_PREVIEW: Final = 32


def _refuse(key: str, reason: str) -> NoReturn:
    raise InvalidHeaderValue(key, reason)


def _normalize(key: str, value: HeaderInput) -> HeaderValue:
    """Turn a caller's value into a header value, or raise ProtocolError."""
    if BARE_RE.fullmatch(key) is None:
        raise MalformedHeader(
            f"key {key!r} is not a bare token (no reserved characters, "
            "whitespace or controls, and not empty)"
        )
    result: HeaderValue
    if type(value) is str:
        result = value
        texts: Iterable[str] = (value,)
    elif isinstance(value, int) and not isinstance(value, bool):
        result = format_uint(value) if value >= 0 else int.__str__(value)
        texts = ()
    elif isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Iterable):
        # A str subclass would compare equal but behave differently; bytes
        # would silently become a list of ints.
        raise TypeError(f"value of {key!r} must be str, int or a sequence of str")
    else:
        result = tuple(value)
        for item in result:
            if type(item) is not str:
                raise TypeError(f"list items of {key!r} must be str, not {type(item).__name__}")
        texts = result
    for text in texts:
        bad = UNCARRIABLE_RE.search(text)
        if bad is not None:
            _refuse(
                key,
                f"no ASBP header can carry {bad.group()!r} (there is no escaping; "
                "a quote, CR, LF or lone surrogate cannot appear in a Value-Token)",
            )
    reason = check_value(key, result)
    if reason is not None:
        _refuse(key, reason)
    return result


class Command:
    """One ASBP Command: a header mapping and an opaque body.

    Args:
        header: keys and values; a value is ``str``, ``int`` (written in
            decimal) or a sequence of ``str`` (a bracketed list).
        body: the data after the header, never decoded.
        **keys: more keys, for the common single-letter ones
            (``Command(c="ping", u=7)``).

    Raises:
        ProtocolError: a key or value breaks the grammar or a reserved key's
            rule (``InvalidHeaderValue``, code 1203, or ``MalformedHeader``,
            code 1201), or the header is empty.
        TypeError: a value or the body has the wrong Python type.
    """

    __slots__ = ("_body", "_header")

    # Owned by this Command and never mutated after construction; only
    # ``header`` (a fresh read-only view) lets it out.
    _header: dict[str, HeaderValue]
    _body: bytes

    def __init__(
        self,
        header: Mapping[str, HeaderInput] | None = None,
        body: bytes = b"",
        /,
        **keys: HeaderInput,
    ) -> None:
        if header is not None and not isinstance(header, Mapping):
            raise TypeError(f"header must be a mapping, not {type(header).__name__}")
        items: dict[str, HeaderValue] = {}
        for source in (header or {}, keys):
            for key, value in source.items():
                if key in items:
                    raise MalformedHeader(f"duplicate key {key!r}")
                items[key] = _normalize(key, value)
        if not items:
            raise MalformedHeader("a Command needs at least one key")
        if type(body) is not bytes:
            if not isinstance(body, bytes | bytearray | memoryview):
                raise TypeError(f"body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        _set_header(self, items)
        _set_body(self, body)

    # -- immutability --------------------------------------------------------

    def __reduce__(self) -> tuple[Any, tuple[dict[str, HeaderValue], bytes]]:
        # copy, deepcopy and pickle rebuild through the trusted constructor:
        # the values were validated when this Command was made.
        return (_trusted, (dict(self._header), self._body))

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"Command is immutable; use with_keys or with_body ({name})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Command is immutable ({name})")

    # -- value semantics -----------------------------------------------------

    @property
    def header(self) -> Mapping[str, HeaderValue]:
        """The header, read-only, in the order the keys were given or read."""
        # A view costs ~40 ns; making it here rather than in every decode
        # keeps it off the path of Commands whose header is only read
        # through the accessors below.
        return MappingProxyType(self._header)

    @property
    def body(self) -> bytes:
        """The data after the header: opaque bytes, never decoded."""
        return self._body

    def __eq__(self, other: object) -> bool:
        # Key order is not meaning: two headers with the same pairs are equal.
        if not isinstance(other, Command):
            return NotImplemented
        return self._body == other._body and self._header == other._header

    def __hash__(self) -> int:
        return hash((frozenset(self._header.items()), self._body))

    def __repr__(self) -> str:
        body = self._body
        shown = repr(body[:_BODY_PREVIEW]) + ("..." if len(body) > _BODY_PREVIEW else "")
        return f"Command({dict(self._header)!r}, {shown})"

    def __iter__(self) -> Iterator[str]:
        return iter(self._header)

    def __contains__(self, key: object) -> bool:
        return key in self._header

    def get(self, key: str) -> HeaderValue | None:
        """The raw value of ``key``, or None."""
        return self._header.get(key)

    # -- derived copies ------------------------------------------------------

    def with_keys(
        self, header: Mapping[str, HeaderInput] | None = None, /, **keys: HeaderInput
    ) -> Command:
        """A copy with keys added or replaced; only the new values are checked.

        Raises:
            ProtocolError: a new key or value is invalid.
        """
        items = dict(self._header)
        for source in (header or {}, keys):
            for key, value in source.items():
                items[key] = _normalize(key, value)
        return _trusted(items, self._body)

    def without_keys(self, *keys: str) -> Command:
        """A copy without ``keys`` (absent keys are ignored).

        Raises:
            MalformedHeader: no key would be left.
        """
        items = {k: v for k, v in self._header.items() if k not in keys}
        if not items:
            raise MalformedHeader("a Command needs at least one key")
        return _trusted(items, self._body)

    def with_body(self, body: bytes) -> Command:
        """A copy with another body."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"body must be bytes, not {type(body).__name__}")
        return _trusted(dict(self._header), bytes(body))

    # -- typed accessors for the reserved keys (§1.3.4.2) ------------------

    def _one(self, key: str) -> str | None:
        # Reserved single-value keys are validated as str on the way in.
        return cast("str | None", self._header.get(key))

    def _many(self, key: str) -> tuple[str, ...]:
        value = self._header.get(key)
        if value is None:
            return ()
        return (value,) if isinstance(value, str) else value

    @property
    def agent_id(self) -> ApplicationAgentId | None:
        """``a``, the Application-Agent-Identifier."""
        value = self._one("a")
        return None if value is None else ApplicationAgentId(value)

    @property
    def broker_id(self) -> str | None:
        """``b``, the Broker-Identifier."""
        return self._one("b")

    @property
    def name(self) -> str | None:
        """``c``, the Command-Name."""
        return self._one("c")

    @property
    def destinations(self) -> tuple[ChannelId, ...]:
        """``d``, the destination Channel-Identifiers (empty if absent)."""
        return tuple(ChannelId(v) for v in self._many("d"))

    @property
    def encoding(self) -> str | None:
        """``e``, the body's charset name; None means binary."""
        return self._one("e")

    @property
    def data_format(self) -> str | None:
        """``f``, the Format OID."""
        return self._one("f")

    @property
    def groups(self) -> tuple[str, ...]:
        """``g``, the destination groups (empty if absent)."""
        return self._many("g")

    @property
    def channel_id(self) -> ChannelId | None:
        """``i``, the Channel-Identifier."""
        value = self._one("i")
        return None if value is None else ChannelId(value)

    @property
    def of_total(self) -> int | None:
        """``o``, this Command's one-based place in a stream."""
        value = self._one("o")
        return None if value is None else parse_uint(value)

    @property
    def mime_type(self) -> str | None:
        """``m``, the body's MIME type."""
        return self._one("m")

    @property
    def recipients(self) -> tuple[ConversationAddress, ...]:
        """``r``, the recipient Conversation-Addresses (empty if absent)."""
        return tuple(ConversationAddress(v) for v in self._many("r"))

    @property
    def publisher(self) -> ConversationAddress | None:
        """``p``, the publishing Subject's Conversation-Address."""
        value = self._one("p")
        return None if value is None else ConversationAddress(value)

    @property
    def subject_id(self) -> SubjectId | None:
        """``s``, the Subject-Identifier."""
        value = self._one("s")
        return None if value is None else SubjectId(value)

    @property
    def total(self) -> int | None:
        """``t``, the number of Commands in the stream this one starts."""
        value = self._one("t")
        return None if value is None else parse_uint(value)

    @property
    def command_id(self) -> int | None:
        """``u``, the User-Agent's Command-Identifier (0..65535)."""
        value = self._one("u")
        return None if value is None else int(value)

    @property
    def exchange_name(self) -> str | None:
        """``x``, the Exchange-Command-Name."""
        return self._one("x")

    @property
    def compression(self) -> str | None:
        """``z``, the body's compression MIME type."""
        return self._one("z")


# The slots' descriptors, bound once. Setting a slot through its descriptor
# is about 25 ns cheaper than object.__setattr__, which first looks the name
# up on the type; like it, it goes around Command.__setattr__, which refuses.
_set_header: Final = cast(MemberDescriptorType, vars(Command)["_header"]).__set__
_set_body: Final = cast(MemberDescriptorType, vars(Command)["_body"]).__set__
_new_object: Final = object.__new__


def _trusted(header: dict[str, HeaderValue], body: bytes) -> Command:
    """Build a Command from values already validated, without checking again.

    The Command takes ownership of ``header``: the caller must not keep or
    mutate it. Only the codec and the derived-copy methods call this.
    """
    command = _new_object(Command)
    _set_header(command, header)
    _set_body(command, body)
    return command
