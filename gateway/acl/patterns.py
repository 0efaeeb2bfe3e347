"""Destination patterns: compiled once, refused when they could run away.

An ACL entry's destination is a regular expression matched against the whole
destination name (``fullmatch``) on every check. The pattern comes from the
operator, but the destination comes from the client, so a pattern that
backtracks badly turns every publish into a denial-of-service lever. Python's
``re`` backtracks and has no time limit, so we refuse risky shapes at load time.

Theory of operation
-------------------
:func:`compile_destination` parses the pattern with ``re``'s own parser (the
same tree the compiler uses, so there is no second grammar to drift) and walks
it with a small allow-list. It refuses:

1. **Backreferences, conditionals and lookarounds** (``\\1``, ``(?(1)a|b)``,
   ``(?=...)``, ``(?<!...)``): not regular, and never needed to name a destination.
2. **Nested variable quantifiers** (``(a+)+``, ``(a|b*)*``, ``(?:x?y)+``): a
   variable repeat inside a repeat of more than one is the classic exponential
   case. A fixed count inside (``(?:[a-z]{2})+``) is allowed: it has one way to match.
3. **Alternation inside a repeat** (``(foo|f)+``): overlapping branches under a
   loop are exponential too. (``(a|b)+`` is fine: ``re`` turns it into ``[ab]+``.)
4. **A second repeat after one that can stop anywhere.** A variable repeat is
   *guarded* when it repeats one character class and is followed by the end of
   the pattern or by a literal character outside that class, as in ``[^/]*/``:
   it has one way to end, so backtracking into it fails at once and it costs
   one pass. Any other repeat (``.*`` before ``/``) can stop at each of the n
   characters of a failing name, and whatever follows is tried from each of
   those stops. So once such a repeat has been seen, only fixed text may
   follow, and a final ``.*`` (which cannot fail): any other repeat there makes
   the match O(n²) or worse (``/a/.*/b/[^x]*`` takes 50 ms on an 8 KiB name,
   ``.*/.*/.*x`` seconds). What is accepted costs O(n·m) for a pattern of m items.

The checker is conservative: it refuses some patterns that would in fact be
fast (``(?:ab)*c[^/]*``) and never accepts one of the shapes above. Patterns are
compiled with ``re.DOTALL``, so ``.`` matches every character: without it
``/private/.*`` would miss ``"/private/\\nx"`` and a DENY entry could be walked
around with a newline.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the stubs live under the old public names
    import sre_constants as _constants
    import sre_parse as _parser
else:  # and the modules under private ones since 3.11 (importing the old names warns)
    from re import _constants, _parser

from asbp.faults import FaultCode
from gateway.errors import LocalError

__all__ = ["FLAGS", "PatternError", "UnsafePatternError", "compile_destination"]

#: The flags every destination pattern is compiled with.
FLAGS: Final = re.DOTALL

_Node = tuple[object, Any]
_Items = Sequence[_Node]

_REPEATS: Final = frozenset(
    {_constants.MAX_REPEAT, _constants.MIN_REPEAT, _constants.POSSESSIVE_REPEAT}
)
_SINGLE_CHAR: Final = frozenset(
    {_constants.LITERAL, _constants.NOT_LITERAL, _constants.ANY, _constants.IN}
)
_CATEGORIES: Final = {
    _constants.CATEGORY_DIGIT: re.compile(r"\d"),
    _constants.CATEGORY_NOT_DIGIT: re.compile(r"\D"),
    _constants.CATEGORY_SPACE: re.compile(r"\s"),
    _constants.CATEGORY_NOT_SPACE: re.compile(r"\S"),
    _constants.CATEGORY_WORD: re.compile(r"\w"),
    _constants.CATEGORY_NOT_WORD: re.compile(r"\W"),
}
# What follows a node: the end of the pattern, one literal code point, or unknown.
_END: Final = -1
_UNKNOWN: Final = -2


# Also a ValueError: it was one before the error tree had it, and callers of
# compile_destination may catch it that way.
class PatternError(LocalError, ValueError):
    """A destination pattern is not a valid regular expression.

    A :class:`~gateway.errors.LocalError`: its callers put its message inside their
    own (an ACL file's error, a fault naming the destination), so ``str()`` has no
    code. ``code`` is the fault those callers report, Sapo's 2001.
    """

    code = FaultCode.INVALID_DESTINATION_NAME


class UnsafePatternError(PatternError):
    """A destination pattern is valid but could take unbounded time to match."""


def compile_destination(pattern: str) -> re.Pattern[str]:
    """Check ``pattern`` and compile it for ``fullmatch`` with :data:`FLAGS`.

    Raises:
        PatternError: empty, or not a valid regular expression.
        UnsafePatternError: a shape that can backtrack without bound (see the
            module docstring); the message says which and how to rewrite it.
    """
    if not pattern:
        raise PatternError("a destination pattern must not be empty")
    try:
        parsed = _parser.parse(pattern, FLAGS)
        compiled = re.compile(pattern, FLAGS)
    except re.error as exc:
        raise PatternError(f"not a valid regular expression: {exc}") from None
    ignore_case = bool(parsed.state.flags & re.IGNORECASE)
    checker = _Checker(ignore_case=ignore_case, dotall=True)
    checker.check(parsed.data)
    if checker.local_ignore_case or checker.local_dotall_off:
        # A (?i:...) or (?-s:...) group changes what some characters match; rather
        # than track its scope, check again as if it applied everywhere.
        _Checker(
            ignore_case=ignore_case or checker.local_ignore_case,
            dotall=not checker.local_dotall_off,
        ).check(parsed.data)
    return compiled


class _Checker:
    __slots__ = ("dotall", "ignore_case", "local_dotall_off", "local_ignore_case", "open_repeat")

    def __init__(self, *, ignore_case: bool, dotall: bool) -> None:
        self.ignore_case = ignore_case
        self.dotall = dotall
        #: A (?i:...) group was seen, or a (?-s:...) one.
        self.local_ignore_case = False
        self.local_dotall_off = False
        #: A repeat that can stop anywhere (such as .* before /) was seen.
        self.open_repeat = False

    def check(self, items: _Items) -> None:
        self._sequence(items, follow=_END, looped=False)

    def _sequence(self, items: _Items, *, follow: int, looped: bool) -> None:
        for index, node in enumerate(items):
            after = _first_literal(items[index + 1]) if index + 1 < len(items) else follow
            self._node(node, follow=after, looped=looped)

    def _node(self, node: _Node, *, follow: int, looped: bool) -> None:
        op, av = node
        if op in _SINGLE_CHAR or op is _constants.AT:
            return
        if op is _constants.SUBPATTERN:
            _group, add_flags, del_flags, inner = av
            self.local_ignore_case |= bool(add_flags & re.IGNORECASE)
            self.local_dotall_off |= bool(del_flags & re.DOTALL)
            self._sequence(inner, follow=follow, looped=looped)
        elif op is _constants.ATOMIC_GROUP:
            self._sequence(av, follow=follow, looped=looped)
        elif op is _constants.BRANCH:
            if looped:
                raise UnsafePatternError(
                    "alternation inside a repeat, as in (foo|f)+, can take exponential "
                    "time; write one entry per alternative, or use a character class"
                )
            for branch in av[1]:
                self._sequence(branch, follow=follow, looped=looped)
        elif op in _REPEATS:
            self._repeat(av, follow=follow, looped=looped)
        elif op is _constants.GROUPREF:
            raise UnsafePatternError("backreferences (\\1, (?P=name)) are not allowed")
        elif op is _constants.GROUPREF_EXISTS:
            raise UnsafePatternError("conditional groups (?(1)...|...) are not allowed")
        elif op is _constants.ASSERT or op is _constants.ASSERT_NOT:
            raise UnsafePatternError(
                "lookahead and lookbehind assertions ((?=, (?!, (?<=, (?<!) are not allowed"
            )
        else:  # pragma: no cover - every opcode the 3.11 parser emits is handled above
            raise UnsafePatternError(f"unsupported regular expression construct {op}")

    def _repeat(self, av: Any, *, follow: int, looped: bool) -> None:
        low, high, body = av
        variable = low != high
        if looped and variable:
            raise UnsafePatternError(
                "nested quantifiers, as in (a+)+ or (?:a?b)*, can take exponential time; "
                "flatten them into one repeat, such as [a-z/]*"
            )
        if high <= 1:  # x? or x{0,1}: the body runs at most once
            self._sequence(body, follow=follow, looped=looped)
            return
        self._sequence(body, follow=_UNKNOWN, looped=True)
        if not variable:
            return
        if self.open_repeat:
            if not self._free(body, follow, high):
                raise UnsafePatternError(
                    "after a repeat that can stop anywhere (such as .* before /), only "
                    "fixed text and a final .* may follow: a second repeat there can take "
                    "polynomial time; use [^/]* for one path segment, as in /a/[^/]*/b/.*"
                )
        elif not self._guarded(body, follow):
            self.open_repeat = True

    def _guarded(self, body: _Items, follow: int) -> bool:
        """One character class followed by the end or a character outside it."""
        item = _single_char(body)
        if item is None:
            return False
        if follow == _END:
            return True
        if follow < 0 or (self.ignore_case and not _caseless(follow)):
            return False
        return not _in_class(item, follow)

    def _free(self, body: _Items, follow: int, high: int) -> bool:
        """A final unbounded repeat of any character: it cannot fail, so costs one pass."""
        item = _single_char(body)
        return (
            item is not None
            and item[0] is _constants.ANY
            and self.dotall
            and follow == _END
            and high == _constants.MAXREPEAT
        )


def _single_char(items: _Items) -> _Node | None:
    """The one single-character matcher ``items`` consists of, seen through groups."""
    while len(items) == 1 and items[0][0] is _constants.SUBPATTERN:
        items = items[0][1][3]
    if len(items) == 1 and items[0][0] in _SINGLE_CHAR:
        return items[0]
    return None


def _first_literal(node: _Node) -> int:
    """The code point ``node`` must start with, or ``_UNKNOWN``."""
    op, av = node
    if op is _constants.LITERAL:
        return int(av)
    if op is _constants.SUBPATTERN or op is _constants.ATOMIC_GROUP:
        inner = av[3] if op is _constants.SUBPATTERN else av
        return _first_literal(inner[0]) if inner else _UNKNOWN
    if op in _REPEATS and av[0] >= 1 and av[2]:
        return _first_literal(av[2][0])
    return _UNKNOWN


def _caseless(code: int) -> bool:
    """An ASCII character that no letter matches under IGNORECASE (``/``, ``.``, ``-``)."""
    return code < 128 and not chr(code).isalpha()


def _in_class(item: _Node, code: int) -> bool:
    """Whether the single-character matcher ``item`` can match ``code``.

    Errs towards True: a True only costs a pattern its "guarded" status.
    """
    op, av = item
    if op is _constants.LITERAL:
        return bool(av == code)
    if op is _constants.NOT_LITERAL:
        return bool(av != code)
    if op is _constants.ANY:
        return True
    negate = False
    hit = False
    for member_op, member in av:
        if member_op is _constants.NEGATE:
            negate = True
        elif member_op is _constants.LITERAL:
            hit = hit or member == code
        elif member_op is _constants.RANGE:
            hit = hit or member[0] <= code <= member[1]
        elif member_op is _constants.CATEGORY and member in _CATEGORIES:
            hit = hit or _CATEGORIES[member].fullmatch(chr(code)) is not None
        else:  # pragma: no cover - defensive: an unknown member might match anything
            return True
    return hit != negate
