"""Load the ``[security]`` table of the broker's TOML config into an :class:`Acl`.

The format (docs/acl.md has the full reference and a worked example)::

    [security.policies.default]
    default_action = "PERMIT"                      # optional; inherited
    entries = [
      { action = "DENY", types = ["TOPIC", "QUEUE"], destination = '/private/.*',
        privileges = ["READ", "WRITE"], condition = { always = true } },
    ]

    [security.policies.vip]
    inherits = "default"

    [[security.policies.vip.entries]]              # the same, one table per entry
    action = "PERMIT"
    types = ["QUEUE"]
    destination = '/specialQueue'
    privileges = ["WRITE"]
    condition = { and = [ { role = "VIP_role" }, { channel_type = ["CONFIDENTIALITY"] } ] }

    [security.agents]                               # Application-Agent -> policy
    billing = "vip"

    [security.roles]                                # Subject role -> policy
    admin = "vip"

No ``[security]`` table means no access control at all (Sapo's "allow
everything"); an empty one turns it on with only the built-in ``/system/`` entry.

Nothing is ignored: an unknown key, a value of the wrong type, an unknown name
or an unsafe pattern stops start-up with an :class:`AclConfigError` that names
the file, the line and the policy entry. ``tomllib`` gives no positions, so the
lines come from a second, structural pass over the same text
(:func:`~gateway.acl.toml_lines.key_lines`); each entry keeps its line too, for
:meth:`Acl.describe` in the logs.
"""

from __future__ import annotations

import difflib
import enum
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

from gateway.acl.conditions import (
    Address,
    Always,
    And,
    ChannelProperty,
    ChannelType,
    Condition,
    Role,
)
from gateway.acl.entries import AclEntry, Action, DestinationType, Privilege, SecurityPolicy
from gateway.acl.errors import AclConfigError
from gateway.acl.patterns import PatternError, compile_destination
from gateway.acl.policy import Acl
from gateway.acl.toml_lines import KeyPath, key_lines
from gateway.errors import LocalError

__all__ = ["SECURITY_TABLE", "acl_from_config", "load_acl"]

#: The top-level table of the broker config that holds the security policies.
SECURITY_TABLE: Final = "security"

_SECURITY_KEYS: Final = ("policies", "agents", "roles")
_POLICY_KEYS: Final = ("inherits", "default_action", "entries")
_ENTRY_KEYS: Final = ("action", "types", "destination", "privileges", "condition")
_CONDITION_KEYS: Final = ("always", "address", "role", "channel_type", "and")
# Names Sapo-Broker's own files use, and what to write instead.
_SAPO_NAMES: Final = {
    "TOPIC_AS_QUEUE": "VIRTUAL_QUEUE",
    "CHANNELTYPE": "channel_type",
    "CHANNEL_TYPE": "channel_type",
    "ALWAYS": "always",
    "ADDRESS": "address",
    "ROLE": "role",
    "AND": "and",
}
_TOML_LINE: Final = re.compile(r"\(at line (\d+),")

_E = TypeVar("_E", bound=enum.Enum)


def load_acl(source: str | os.PathLike[str], *, name: str | None = None) -> Acl:
    """Load the ``[security]`` table of a TOML document.

    Args:
        source: a path (``pathlib.Path`` or other ``os.PathLike``) to read, or the
            TOML text itself as a ``str``. Other tables in the document (the rest
            of the broker's config) are left alone.
        name: how to name the source in messages (default: the path, or
            ``"<string>"``).

    Raises:
        AclConfigError: the file cannot be read, is not TOML, or holds a bad policy.
            Its message starts with ``name:line:``.
    """
    if isinstance(source, str):
        text = source
        name = name or "<string>"
    else:
        path = Path(source)
        name = name or str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise AclConfigError(f"cannot read: {exc.strerror or exc}", source=name) from exc
        except UnicodeDecodeError as exc:
            raise AclConfigError(f"not UTF-8 text: {exc.reason}", source=name) from exc
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        raise AclConfigError(
            f"not valid TOML: {exc}", source=name, line=int(found.group(1)) if found else None
        ) from exc
    return acl_from_config(document, text=text, source=name)


def acl_from_config(
    document: Mapping[str, Any], *, text: str | None = None, source: str | None = None
) -> Acl:
    """Build the :class:`Acl` from an already parsed config document.

    For a broker that parses its config file once: pass the whole document, and
    the text it was parsed from so errors can name lines.

    Args:
        document: the parsed TOML document; only its ``[security]`` table is read.
        text: the TOML text ``document`` came from, for line numbers.
        source: how to name the file in messages.

    Raises:
        AclConfigError: a bad policy; ``line`` is set when ``text`` was given.
    """
    security = document.get(SECURITY_TABLE)
    if security is None:
        return Acl.allow_all()
    return _Loader(text, source).build(security)


class _Invalid(LocalError):
    """A fault in the table at ``key``, before :meth:`_Loader.error` finds its line."""

    def __init__(self, detail: str, key: KeyPath) -> None:
        super().__init__(detail)
        self.detail = detail
        self.key = key


class _Loader:
    __slots__ = ("_lines", "source", "text")

    def __init__(self, text: str | None, source: str | None) -> None:
        self.text = text
        self.source = source
        self._lines: dict[KeyPath, int] | None = None

    def lines(self) -> dict[KeyPath, int]:
        """Each key's line, scanned once per load (empty without the text)."""
        if self._lines is None:
            self._lines = {} if self.text is None else key_lines(self.text)
        return self._lines

    def build(self, security: object) -> Acl:
        try:
            table = _table(security, "[security]", ())
            _known_keys(table, _SECURITY_KEYS, ())
            policies = [
                self.policy(name, value)
                for name, value in _table(
                    table.get("policies", {}), "[security.policies]", ("policies",)
                ).items()
            ]
            agents = _assignments(table.get("agents", {}), "agents")
            roles = _assignments(table.get("roles", {}), "roles")
            try:
                return Acl(policies, agents=agents, roles=roles, source=self.source)
            except AclConfigError as exc:
                raise _Invalid(exc.detail, exc.key or ()) from None
        except _Invalid as invalid:
            raise self.error(invalid) from None

    def error(self, invalid: _Invalid) -> AclConfigError:
        lines = self.lines()
        line = None
        path: KeyPath = (SECURITY_TABLE, *invalid.key)
        while path and line is None:
            line = lines.get(path)
            path = path[:-1]
        return AclConfigError(invalid.detail, source=self.source, line=line, key=invalid.key)

    def policy(self, name: str, value: object) -> SecurityPolicy:
        key: KeyPath = ("policies", name)
        what = f"policy {name!r}"
        table = _table(value, what, key)
        _known_keys(table, _POLICY_KEYS, key, what)
        parent = table.get("inherits")
        if parent is not None and not (isinstance(parent, str) and parent):
            _fail(f"{what}: inherits must name a policy, not {_kind(parent)}", (*key, "inherits"))
        default_action = None
        if "default_action" in table:
            default_action = _member(
                Action, table["default_action"], f"{what}: default_action", (*key, "default_action")
            )
        entries = table.get("entries", [])
        if not isinstance(entries, list):
            _fail(
                f"{what}: entries must be an array of tables, not {_kind(entries)}",
                (*key, "entries"),
            )
        if not name:
            _fail(f"{what}: a security policy needs a name", key)
        return SecurityPolicy(
            name,
            tuple(self.entry(name, index, entry) for index, entry in enumerate(entries)),
            parent,
            default_action,
        )

    def entry(self, policy: str, index: int, value: object) -> AclEntry:
        key: KeyPath = ("policies", policy, "entries", index)
        what = f"policy {policy!r}, entries[{index}]"
        table = _table(value, what, key)
        _known_keys(table, _ENTRY_KEYS, key, what)
        for required in _ENTRY_KEYS:
            if required not in table:
                hint = " (condition = { always = true } applies it always)"
                _fail(f"{what}: missing {required!r}{hint if required == 'condition' else ''}", key)
        action = _member(Action, table["action"], f"{what}: action", (*key, "action"))
        types = _members(DestinationType, table["types"], f"{what}: types", (*key, "types"))
        privileges = _members(
            Privilege, table["privileges"], f"{what}: privileges", (*key, "privileges")
        )
        destination = table["destination"]
        if not isinstance(destination, str):
            _fail(
                f"{what}: destination must be a string, not {_kind(destination)}",
                (*key, "destination"),
            )
        try:
            pattern = compile_destination(destination)
        except PatternError as exc:
            _fail(f"{what}: destination {destination!r}: {exc}", (*key, "destination"))
        condition = _condition(table["condition"], what, (*key, "condition"))
        # The entry keeps its line so that Acl.describe can point a log reader at it.
        line = self.lines().get((SECURITY_TABLE, *key))
        return AclEntry(action, types, pattern, privileges, condition, line=line)


def _condition(value: object, what: str, key: KeyPath) -> Condition:
    table = _table(value, f"{what}: condition", key)
    if len(table) != 1:
        _fail(
            f"{what}: a condition has exactly one key ({', '.join(_CONDITION_KEYS)}); "
            "combine several with and = [ {...}, {...} ]",
            key,
        )
    ((name, item),) = table.items()
    here = (*key, name)
    if name == "always":
        if item is not True:
            _fail(f"{what}: always must be true (an entry that never applies is a no-op)", here)
        return Always()
    if name == "address":
        if not isinstance(item, str):
            _fail(f"{what}: address must be a string such as '10.0.0.0/8', not {_kind(item)}", here)
        try:
            return Address.parse(item)
        except ValueError as exc:
            _fail(f"{what}: address {item!r}: {exc}", here)
    if name == "role":
        if not (isinstance(item, str) and item):
            _fail(f"{what}: role must be a non-empty string, not {_kind(item)}", here)
        return Role(item)
    if name == "channel_type":
        return ChannelType(_members(ChannelProperty, item, f"{what}: channel_type", here))
    if name == "and":
        if not (isinstance(item, list) and item):
            _fail(f"{what}: and must be a non-empty array of conditions", here)
        return And(tuple(_condition(inner, what, (*here, i)) for i, inner in enumerate(item)))
    _fail(f"{what}: unknown condition {name!r}{_suggest(name, _CONDITION_KEYS)}", here)


def _assignments(value: object, table_name: str) -> dict[str, str]:
    table = _table(value, f"[security.{table_name}]", (table_name,))
    for name, policy in table.items():
        if not (isinstance(policy, str) and policy):
            _fail(
                f"[security.{table_name}] {name!r} must name a policy, not {_kind(policy)}",
                (table_name, name),
            )
    return table


def _member(kind: type[_E], value: object, what: str, key: KeyPath) -> _E:
    names = [member.name for member in kind]
    if not isinstance(value, str):
        _fail(f"{what} must be one of {', '.join(names)}, not {_kind(value)}", key)
    try:
        return kind[value]
    except KeyError:
        pass
    if value in _SAPO_NAMES:
        hint = f"; Sapo-Broker's {value} is written {_SAPO_NAMES[value]} here"
    elif " " in value.strip():
        hint = f"; list several as an array: {value.split()!r}".replace("'", '"')
    else:
        hint = _suggest(value.upper(), names)
    expected = " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)
    _fail(f"{what}: unknown value {value!r} (expected {expected}){hint}", key)


def _members(kind: type[_E], value: object, what: str, key: KeyPath) -> frozenset[_E]:
    items = [value] if isinstance(value, str) else value
    if not (isinstance(items, list) and items):
        _fail(f"{what} must be a non-empty array of names, not {_kind(value)}", key)
    members: list[_E] = []
    for index, item in enumerate(items):
        here = key if isinstance(value, str) else (*key, index)
        member = _member(kind, item, what, here)
        if member in members:
            _fail(f"{what}: {member.name} is listed twice", here)
        members.append(member)
    return frozenset(members)


def _table(value: object, what: str, key: KeyPath) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(f"{what} must be a table, not {_kind(value)}", key)
    return value


def _known_keys(
    table: Mapping[str, object], known: Collection[str], key: KeyPath, what: str = "[security]"
) -> None:
    for name in table:
        if name not in known:
            _fail(f"{what}: unknown key {name!r}{_suggest(name, known)}", (*key, name))


def _suggest(word: str, options: Collection[str]) -> str:
    if word in _SAPO_NAMES and _SAPO_NAMES[word] in options:
        return f"; Sapo-Broker's {word} is written {_SAPO_NAMES[word]} here"
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date or time"
    return type(value).__name__  # pragma: no cover - tomllib makes nothing else


def _fail(detail: str, key: KeyPath) -> NoReturn:
    raise _Invalid(detail, key)
