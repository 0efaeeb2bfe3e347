"""Every setting, described once from the dataclasses of :mod:`gateway.config.model`.

A :class:`Setting` is one field of :class:`~gateway.config.model.GatewayConfig` (or of
one of its tables): its dotted key (``channels.long_poll_timeout``), its kind (from the
field's type), its default, and its doc (the field's ``#:`` comment). Its environment
variable and command-line flag follow from the key. The loader, the ``--help`` text and
``docs/configuration.md`` all read this one description, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
from pathlib import Path
from typing import Final, Literal, get_args, get_origin, get_type_hints

from gateway.config.model import GatewayConfig

__all__ = [
    "ACL",
    "AGENTS",
    "AGENTS_BASE_DIR",
    "CONFIG_ENV_VAR",
    "COURSES",
    "ENV_PREFIX",
    "FOREIGN_ENV_VARS",
    "LOG_LEVELS",
    "Kind",
    "Setting",
    "by_key",
    "setting_names",
    "settings",
    "table_classes",
]

#: Every environment variable the broker reads starts with this.
ENV_PREFIX: Final = "ASBP_"
#: Names the TOML file when ``--config`` does not.
CONFIG_ENV_VAR: Final = "ASBP_CONFIG"
#: ``ASBP_*`` variables that belong to other programs (the test suite's timeout unit);
#: the broker leaves them alone instead of refusing them as unknown settings.
FOREIGN_ENV_VARS: Final = frozenset(
    {
        # The test suite's timeout unit.
        "ASBP_TEST_TIMEOUT_UNIT",
        # The test suite's loop for its in-process servers (tests/conftest.py).
        "ASBP_TEST_LOOP",
        # The SDK's and the examples' own settings, often set in the same shell.
        "ASBP_AGENT_ID",
        "ASBP_AGENT_KEY_FILE",
        "ASBP_TUBE_URLS",
        "ASBP_URL",
    }
)
#: The accepted ``log_level`` names; case does not matter.
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")

#: The ``[agents]`` table: file only, checked by :mod:`gateway.auth`, not a setting.
AGENTS: Final = "agents"
#: The directory ``[agents]`` key paths resolve against: the file's, never set.
AGENTS_BASE_DIR: Final = "agents_base_dir"
#: The :class:`~gateway.acl.Acl` built from the file's ``[security]`` table.
ACL: Final = "acl"
#: The ``[courses]`` table: file only, checked by :mod:`courses.settings`, not a setting.
COURSES: Final = "courses"
# Fields of GatewayConfig that are not plain settings.
_NOT_SETTINGS: Final = (AGENTS, AGENTS_BASE_DIR, ACL, COURSES)

# Tables of GatewayConfig that hold one dataclass each. The TLS variables keep the
# names operators expect (ASBP_TLS_CERTFILE); the limit tables use "__" between table
# and field (ASBP_CHANNELS__LONG_POLL_TIMEOUT) because their field names hold "_".
_ENV_TABLE_SEPARATOR: Final = {"tls": "_"}
# Settings with a command-line flag; the rest come from the file or the environment.
_FLAGS: Final = {
    "host": "--host",
    "port": "--port",
    "server": "--server",
    "loop": "--loop",
    "tls.certfile": "--tls-cert",
    "tls.keyfile": "--tls-key",
    "broker_id": "--broker-id",
    "data_dir": "--data-dir",
    "engine": "--engine",
    "redis_url": "--redis-url",
    "event_log.mode": "--event-log",
    "insecure_dev_tubes": "--insecure-dev-tubes",
    "authenticate_command": "--authenticate-command",
    "failed_handshakes_per_minute": "--failed-handshakes-per-minute",
    "log_format": "--log-format",
    "log_level": "--log-level",
}

Kind = Literal["str", "optional_str", "int", "float", "bool", "path", "choice"]


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One configurable value, as the file, the environment and the flags know it."""

    #: Dotted key: ``port``, or ``channels.long_poll_timeout`` inside a table.
    key: str
    #: How a value is checked and converted; follows the dataclass field's type.
    kind: Kind
    #: The dataclass default; ``None`` when the setting is unset by default.
    default: object
    #: The field's ``#:`` comment.
    doc: str
    #: The environment variable that sets it.
    env: str
    #: The command-line flag that sets it, if it has one.
    flag: str | None
    #: The accepted values of a ``choice``.
    choices: tuple[str, ...] = ()

    @property
    def table(self) -> str | None:
        """The TOML table holding the setting, or ``None`` at the top level."""
        table, dot, _ = self.key.partition(".")
        return table if dot else None

    @property
    def name(self) -> str:
        """The key within its table."""
        return self.key.rpartition(".")[2]


@functools.cache
def settings() -> tuple[Setting, ...]:
    """Every setting, in the order of the dataclass fields."""
    result: list[Setting] = []
    defaults = GatewayConfig()
    hints = get_type_hints(GatewayConfig)
    docs = _field_docs(GatewayConfig)
    for field in dataclasses.fields(GatewayConfig):
        if field.name in _NOT_SETTINGS:
            continue
        table_class = _table_class(hints[field.name])
        if table_class is None:
            default = getattr(defaults, field.name)
            result.append(
                _setting(field.name, hints[field.name], default, docs.get(field.name, ""))
            )
            continue
        table_default = getattr(defaults, field.name)
        table_hints = get_type_hints(table_class)
        table_docs = _field_docs(table_class)
        for sub in dataclasses.fields(table_class):
            default = None if table_default is None else getattr(table_default, sub.name)
            key = f"{field.name}.{sub.name}"
            result.append(
                _setting(key, table_hints[sub.name], default, table_docs.get(sub.name, ""))
            )
    return tuple(result)


@functools.cache
def by_key() -> dict[str, Setting]:
    """Every setting by its dotted key."""
    return {s.key: s for s in settings()}


@functools.cache
def table_classes() -> dict[str, type]:
    """The tables of :class:`GatewayConfig` (``tls``, ``channels``, ...) and their classes."""
    hints = get_type_hints(GatewayConfig)
    result: dict[str, type] = {}
    for field in dataclasses.fields(GatewayConfig):
        table_class = _table_class(hints[field.name])
        if table_class is not None:
            result[field.name] = table_class
    return result


def setting_names(key: str) -> str:
    """Every way to set ``key``: ``tls.keyfile in the file, ASBP_TLS_KEYFILE, --tls-key``."""
    setting = by_key()[key]
    names = [f"{key} in the file", setting.env]
    if setting.flag:
        names.append(setting.flag)
    return ", ".join(names)


def _setting(key: str, hint: object, default: object, doc: str) -> Setting:
    table, dot, name = key.rpartition(".")
    if dot:
        env = f"{ENV_PREFIX}{table.upper()}{_ENV_TABLE_SEPARATOR.get(table, '__')}{name.upper()}"
    else:
        env = f"{ENV_PREFIX}{key.upper()}"
    kind, choices = _kind(key, hint)
    return Setting(key, kind, default, doc, env, _FLAGS.get(key), choices)


def _kind(key: str, hint: object) -> tuple[Kind, tuple[str, ...]]:
    if key == "log_level":  # a plain str in GatewayConfig, checked against the names here
        return "choice", LOG_LEVELS
    simple: dict[object, Kind] = {str: "str", bool: "bool", int: "int", float: "float"}
    if hint in simple:
        return simple[hint], ()
    if hint is Path:
        return "path", ()
    if get_origin(hint) is Literal:
        return "choice", tuple(str(arg) for arg in get_args(hint))
    if get_origin(hint) is types.UnionType and set(get_args(hint)) == {str, type(None)}:
        return "optional_str", ()
    raise TypeError(f"gateway.config.fields cannot convert {key} of type {hint!r}; teach _kind")


def _table_class(hint: object) -> type | None:
    candidates = get_args(hint) if get_origin(hint) is types.UnionType else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments above each field of ``cls``, joined into one line each."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and pending:
            docs[match[1]] = " ".join(pending)
        pending = []
    return docs
