"""Which line each key of a TOML document is on, for error messages.

``tomllib`` returns plain dicts and lists with no positions, but an operator
fixing a policy file needs the line. So, only when a loaded policy turns out to
be wrong, this module re-reads the same text with a small scanner that follows
TOML's structure (table headers, arrays of tables, dotted keys, inline tables,
arrays, the four kinds of string, comments) without converting any value, and
maps every key path to the line its value starts on::

    [security.policies.vip]                       ("security", "policies", "vip")
    inherits = "default"                          (..., "vip", "inherits")
    entries = [                                   (..., "vip", "entries")
      { action = "DENY", ... },                   (..., "vip", "entries", 0)
    ]
    [[security.policies.vip.entries]]             (..., "vip", "entries", 1)

It runs on text ``tomllib`` has already accepted, so it needs no error
reporting of its own; on text it cannot follow it stops and returns what it
has found so far (callers then fall back to an enclosing key's line).
"""

from __future__ import annotations

import bisect
import contextlib
import re
import tomllib
from typing import Final

from gateway.errors import LocalError

__all__ = ["KeyPath", "key_lines"]

#: A path into the parsed document: table keys and array indexes.
KeyPath = tuple[str | int, ...]

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
# A number, boolean or date: runs up to the next delimiter (dates may hold a space).
_SCALAR: Final = re.compile(r"[^,\]}\r\n#]+")


class _ScanError(LocalError):
    """The scanner met text it cannot follow; :func:`key_lines` keeps what it found."""


def key_lines(text: str) -> dict[KeyPath, int]:
    """Map each key path of the TOML document ``text`` to its 1-based line.

    A table's path maps to its header line, an array element's to the line the
    element starts on, and a key's to the line of ``key = value``. Paths of
    arrays of tables include the element index, as ``tomllib`` builds them.
    """
    scanner = _Scanner(text)
    # Best effort: on text it cannot follow, keep the lines found before it.
    with contextlib.suppress(_ScanError):
        scanner.document()
    return scanner.lines


class _Scanner:
    __slots__ = ("arrays", "lines", "newlines", "pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.lines: dict[KeyPath, int] = {}
        # Array-of-tables path -> how many elements it has so far.
        self.arrays: dict[KeyPath, int] = {}
        self.newlines = [index for index, char in enumerate(text) if char == "\n"]

    # -- helpers ---------------------------------------------------------------

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.pos):
            raise _ScanError(token)
        self.pos += len(token)

    def skip(self, *, newlines: bool = False) -> None:
        """Skip spaces, tabs and comments (and line breaks if ``newlines``)."""
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            elif char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return

    def record(self, path: KeyPath) -> None:
        """Note the current line for ``path`` and each of its prefixes (first wins)."""
        line = bisect.bisect_left(self.newlines, self.pos) + 1
        for end in range(1, len(path) + 1):
            self.lines.setdefault(path[:end], line)

    def resolve(self, key: tuple[str, ...]) -> KeyPath:
        """A header's key with the current index of each array of tables it passes."""
        path: KeyPath = ()
        for part in key:
            path = (*path, part)
            count = self.arrays.get(path)
            if count:
                path = (*path, count - 1)
        return path

    # -- structure -------------------------------------------------------------

    def document(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip(newlines=True)
            if self.pos >= len(self.text):
                return
            if self.text.startswith("[[", self.pos):
                self.pos += 2
                key = self.key()
                self.expect("]]")
                array = (*self.resolve(key[:-1]), key[-1])
                index = self.arrays.get(array, 0)
                self.arrays[array] = index + 1
                table = (*array, index)
                self.record(table)
            elif self.peek() == "[":
                self.pos += 1
                key = self.key()
                self.expect("]")
                table = (*self.resolve(key[:-1]), key[-1])
                self.record(table)
            else:
                key = self.key()
                self.expect("=")
                self.value((*table, *key))

    def key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self.skip()
            parts.append(self.simple_key())
            self.skip()
            if self.peek() != ".":
                return tuple(parts)
            self.pos += 1

    def simple_key(self) -> str:
        if self.peek() in ('"', "'"):
            start = self.pos
            self.string()
            # Let tomllib undo the escapes, exactly as it did for the document.
            decoded: str = tomllib.loads("k = " + self.text[start : self.pos])["k"]
            return decoded
        match = _BARE_KEY.match(self.text, self.pos)
        if match is None:
            raise _ScanError("key")
        self.pos = match.end()
        return match.group()

    def value(self, path: KeyPath) -> None:
        self.skip()
        self.record(path)
        char = self.peek()
        if char in ('"', "'"):
            self.string()
        elif char == "{":
            self.inline_table(path)
        elif char == "[":
            self.array(path)
        else:
            match = _SCALAR.match(self.text, self.pos)
            if match is None:
                raise _ScanError("value")
            self.pos = match.end()

    def inline_table(self, path: KeyPath) -> None:
        self.pos += 1
        while True:
            self.skip(newlines=True)
            if self.peek() == "}":
                self.pos += 1
                return
            key = self.key()
            self.expect("=")
            self.value((*path, *key))
            self.skip(newlines=True)
            if self.peek() == ",":
                self.pos += 1

    def array(self, path: KeyPath) -> None:
        self.pos += 1
        index = 0
        while True:
            self.skip(newlines=True)
            if self.peek() == "]":
                self.pos += 1
                return
            self.value((*path, index))
            index += 1
            self.skip(newlines=True)
            if self.peek() == ",":
                self.pos += 1

    def string(self) -> None:
        text = self.text
        quote = text[self.pos]
        if text.startswith(quote * 3, self.pos):
            index = self.pos + 3
            while True:
                if index >= len(text):
                    raise _ScanError("string")
                if quote == '"' and text[index] == "\\":
                    index += 2
                elif text.startswith(quote * 3, index):
                    # Up to two quotes may end the content right before the closing three.
                    run = index + 3
                    while run < index + 5 and text.startswith(quote, run):
                        run += 1
                    self.pos = run
                    return
                else:
                    index += 1
        index = self.pos + 1
        while True:
            if index >= len(text) or text[index] == "\n":
                raise _ScanError("string")
            if quote == '"' and text[index] == "\\":
                index += 2
            elif text[index] == quote:
                self.pos = index + 1
                return
            else:
                index += 1
