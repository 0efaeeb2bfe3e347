"""Load a :class:`~gateway.config.model.GatewayConfig` from a TOML file, ``ASBP_*`` and flags.

Theory of operation
-------------------
Every setting is described once, by a :class:`Setting` derived from the dataclasses in
:mod:`gateway.config.model`: its dotted key (``channels.long_poll_timeout``), its kind (from
the field's type), its default, and its doc (the field's ``#:`` comment). Its
environment variable and command-line flag follow from the key. The loader, the
``--help`` text and ``docs/configuration.md`` all read that one description, so they
cannot drift apart.

Loading reads four layers, lowest precedence first::

    defaults  <  TOML file  <  ASBP_* environment  <  flags (or an overrides mapping)

Each layer yields ``{key: (value, source)}`` with the value already converted to the
field's type, where ``source`` says where it came from: ``broker.toml:port``,
``ASBP_PORT`` or ``--port``. The layers are merged key by key, then the checks that
span fields run (TLS needs both files, insecure Tubes need loopback, ...) and the frozen
dataclasses are built. Every error is a :class:`ConfigError` that names the source of the
offending value. Nothing is ignored: an unknown key in the file, an unknown ``ASBP_*``
variable or an unknown override is an error, with a suggestion when it looks like a typo.

Relative paths in the TOML file (``data_dir``, the TLS files, the key files of
``[agents]``) resolve against the file's directory, wherever the broker was started
from. Relative paths from the environment or flags resolve against the working
directory, as a shell user expects.

Two tables are not settings and can only come from the file: ``[agents.<identity>]``
(keys, checked by :mod:`gateway.auth.credentials`, and the ``serves`` allow-list, checked
by :mod:`gateway.auth.trust`) and ``[security]`` (the access-control lists, built by
:func:`gateway.acl.acl_from_config` from the file's text, so an error names its line).

Regenerate the reference with ``python -m gateway.config.settings > docs/configuration.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import inspect
import ipaddress
import math
import os
import re
import sys
import tomllib
import types
import unicodedata
import urllib.parse
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final, Literal, get_args, get_origin, get_type_hints

import orjson

from asbp.grammar import RESERVED, is_bare
from gateway.acl import SECURITY_TABLE, Acl, AclConfigError, acl_from_config
from gateway.acl.toml_lines import key_lines
from gateway.auth.trust import AgentTrust, ServeConfigError
from gateway.config.model import GatewayConfig

__all__ = [
    "BROKER_ID_PATTERN",
    "CONFIG_ENV_VAR",
    "ENV_PREFIX",
    "FOREIGN_ENV_VARS",
    "LOG_LEVELS",
    "ConfigError",
    "Setting",
    "add_arguments",
    "config_reference",
    "config_to_dict",
    "config_to_toml",
    "load_config",
    "settings",
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
        # The SDK's and the examples' own settings, often set in the same shell.
        "ASBP_AGENT_ID",
        "ASBP_AGENT_KEY_FILE",
        "ASBP_TUBE_URLS",
        "ASBP_URL",
    }
)
#: The accepted ``log_level`` names; case does not matter.
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
#: What a ``broker_id`` may look like: conservative, so it is safe as an ASBP header
#: value, in a URL, in a log line and as part of a file or Redis key name.
BROKER_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")

# Tables of GatewayConfig that hold one dataclass each. The TLS variables keep the
# names operators expect (ASBP_TLS_CERTFILE); the limit tables use "__" between table
# and field (ASBP_CHANNELS__LONG_POLL_TIMEOUT) because their field names hold "_".
_ENV_TABLE_SEPARATOR: Final = {"tls": "_"}
# Settings with a command-line flag; the rest come from the file or the environment.
_FLAGS: Final = {
    "host": "--host",
    "port": "--port",
    "server": "--server",
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
# Fields that are not plain settings: the [agents] table (file only) and its base
# directory, which is derived from the file's location, and the Acl built from the
# file's [security] table.
_AGENTS: Final = "agents"
_AGENTS_BASE_DIR: Final = "agents_base_dir"
_ACL: Final = "acl"
_NOT_SETTINGS: Final = (_AGENTS, _AGENTS_BASE_DIR, _ACL)
_SECURITY_FILE_ONLY: Final = (
    f"unknown setting: the [{SECURITY_TABLE}] table (access control) can only be set in "
    "the TOML file"
)
# What to say when a table that only the file can hold is set elsewhere.
_FILE_ONLY: Final = {
    _AGENTS: "unknown setting: the [agents] table can only be set in the TOML file",
    SECURITY_TABLE: _SECURITY_FILE_ONLY,
    _ACL: _SECURITY_FILE_ONLY,
}
# The broker's own Command-Names (gateway.routing.builtin_commands.PREFIX); an Authenticate-Command
# there could never reach an agent.
_RESERVED_COMMAND_PREFIX: Final = "asbp."
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_INT_RE: Final = re.compile(r"[+-]?[0-9]+")
_BARE_KEY_RE: Final = re.compile(r"[A-Za-z0-9_-]+")

Kind = Literal["str", "optional_str", "int", "float", "bool", "path", "choice"]


class ConfigError(ValueError):
    """A setting is unknown, has the wrong type, or breaks a rule.

    Raised at start-up and never sent to a peer, so it is a ``ValueError`` rather than
    an :class:`~asbp.errors.AsbpError` (which carries a wire fault code).

    Attributes:
        source: where the offending value came from (``broker.toml:port``, ``ASBP_PORT``,
            ``--port``), or ``None`` when no single value is at fault.
        detail: what is wrong, without the source.
    """

    def __init__(self, detail: str, *, source: str | None = None) -> None:
        self.source = source
        self.detail = detail
        super().__init__(detail if source is None else f"{source}: {detail}")


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


def load_config(
    overrides: argparse.Namespace | Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
) -> GatewayConfig:
    """Build the broker's configuration from every source, highest precedence last.

    Args:
        overrides: the highest layer. Either the parsed flags of ``asbp broker`` (an
            ``argparse.Namespace`` whose attributes are the flags' destinations, ``None``
            meaning "not given"), or a mapping from dotted setting keys (``port``,
            ``tls.certfile``, ``channels.long_poll_timeout``) to values, where the key
            ``config`` names the TOML file. Values may be strings, parsed as in the
            environment, or already of the setting's type.
        environ: where ``ASBP_*`` variables and ``ASBP_CONFIG`` are read from.

    Raises:
        ConfigError: a file that cannot be read or parsed, an unknown key, variable or
            override, a value of the wrong type or out of range, or settings that do not
            go together. The message names the source of the value at fault.
    """
    flag_layer, config_path = _overrides_layer(overrides)
    if config_path is None and CONFIG_ENV_VAR in environ:
        config_path = (environ[CONFIG_ENV_VAR], CONFIG_ENV_VAR)
    file = _File() if config_path is None else _read_file(*config_path)
    env_layer = _env_layer(environ)
    return _build({**file.layer, **env_layer, **flag_layer}, file)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and a flag for each setting that has one to ``parser``.

    Every flag defaults to ``None`` ("not given"), so :func:`load_config` can tell a
    flag from a lower layer; values are checked there, with the other sources.
    """
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"the TOML file to read (default: ${CONFIG_ENV_VAR}, else none)",
    )
    for setting in settings():
        if setting.flag is None:
            continue
        help_text = f"{_first_sentence(setting.doc)} [env: {setting.env}]".replace("%", "%%")
        if setting.kind == "bool":
            parser.add_argument(
                setting.flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            if setting.choices:
                metavar: str | None = "{" + ",".join(setting.choices) + "}"
            else:
                metavar = "PATH" if setting.kind == "path" else None
            parser.add_argument(setting.flag, metavar=metavar, default=None, help=help_text)


# --- the layers ---------------------------------------------------------------------------

_Layer = dict[str, tuple[object, str]]


@dataclasses.dataclass(slots=True)
class _File:
    """What the TOML file contributed."""

    layer: _Layer = dataclasses.field(default_factory=dict)
    agents: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The Acl of the [security] table; None without one.
    acl: Acl | None = None
    #: The file's text, for the lines of later errors.
    text: str = ""
    #: The file's directory, or the working directory without a file.
    base_dir: Path = Path(".")
    #: How the file was named, for messages.
    name: str = ""


def _overrides_layer(
    overrides: argparse.Namespace | Mapping[str, object] | None,
) -> tuple[_Layer, tuple[str, str] | None]:
    layer: _Layer = {}
    config_path: tuple[str, str] | None = None
    if overrides is None:
        return layer, None
    if isinstance(overrides, argparse.Namespace):
        # Only flag destinations: argparse adds attributes of its own ("command").
        given = vars(overrides)
        if given.get("config") is not None:
            config_path = (_text_path(given["config"], "--config"), "--config")
        for setting in settings():
            if setting.flag is None:
                continue
            value = given.get(setting.flag.removeprefix("--").replace("-", "_"))
            if value is not None:
                layer[setting.key] = (_convert(setting, value, setting.flag), setting.flag)
        return layer, config_path
    by_key = _by_key()
    for key, value in overrides.items():
        source = f"override {key!r}"
        if value is None:
            continue
        if key == "config":
            config_path = (_text_path(value, source), source)
            continue
        known = by_key.get(key)
        if known is None:
            if key in (_AGENTS, _ACL, SECURITY_TABLE):
                raise ConfigError(_FILE_ONLY[key], source=source)
            raise ConfigError(f"unknown setting{_suggest(key, [*by_key, 'config'])}", source=source)
        layer[key] = (_convert(known, value, source), source)
    return layer, config_path


def _read_file(raw_path: str, named_by: str) -> _File:
    if not raw_path:
        raise ConfigError("the config file name must not be empty", source=named_by)
    path = Path(raw_path).expanduser()
    try:
        # Read as text once: tomllib parses it, and the [security] loader and the
        # checks below find lines in it.
        text = path.read_bytes().decode("utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {raw_path!r} does not exist", source=named_by) from None
    except OSError as exc:
        detail = exc.strerror or str(exc)
        raise ConfigError(
            f"cannot read config file {raw_path!r}: {detail}", source=named_by
        ) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=raw_path) from exc

    # Lexically absolute, symlinks kept: a file reached through a symlink (a Kubernetes
    # ConfigMap mount, say) resolves relative paths next to the link, as its user sees it.
    file = _File(base_dir=Path(os.path.abspath(path)).parent, name=raw_path, text=text)
    by_key = _by_key()
    tables = sorted({s.table for s in settings() if s.table is not None})
    for key, value in data.items():
        if key in by_key:
            _file_value(file, by_key[key], value)
        elif key in tables:
            if not isinstance(value, dict):
                raise _expected("a table", value, f"{raw_path}:{key}")
            for name, item in value.items():
                setting = by_key.get(f"{key}.{name}")
                if setting is None:
                    names = [s.name for s in settings() if s.table == key]
                    raise ConfigError(
                        f"unknown setting{_suggest(name, names)}", source=f"{raw_path}:{key}.{name}"
                    )
                _file_value(file, setting, item)
        elif key == _AGENTS:
            file.agents = _agents_table(value, f"{raw_path}:{key}")
        elif key == SECURITY_TABLE:
            file.acl = _security_table(data, file)
        elif key in (_AGENTS_BASE_DIR, _ACL):
            detail = (
                "cannot be set: it is the directory this file is in"
                if key == _AGENTS_BASE_DIR
                else f"cannot be set: write the access-control lists in [{SECURITY_TABLE}]"
            )
            raise ConfigError(detail, source=f"{raw_path}:{key}")
        else:
            known = [
                *(s.key for s in settings() if s.table is None),
                *tables,
                _AGENTS,
                SECURITY_TABLE,
            ]
            what = "table" if isinstance(value, dict) else "setting"
            raise ConfigError(f"unknown {what}{_suggest(key, known)}", source=f"{raw_path}:{key}")
    return file


def _file_value(file: _File, setting: Setting, value: object) -> None:
    source = f"{file.name}:{setting.key}"
    converted = _convert(setting, value, source, typed=True)
    if isinstance(converted, Path) and not converted.is_absolute():
        converted = file.base_dir / converted
    file.layer[setting.key] = (converted, source)


def _security_table(document: Mapping[str, Any], file: _File) -> Acl:
    try:
        return acl_from_config(document, text=file.text, source=file.name)
    except AclConfigError as exc:
        # The message names the file and the line: "broker.toml:12: policy 'vip', ..."
        where = f"{file.name}:{exc.line}" if exc.line is not None else f"{file.name}:security"
        raise ConfigError(exc.detail, source=where) from exc


def _agents_table(value: object, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _expected("a table of agent identities", value, source)
    for identity, table in value.items():
        if not isinstance(table, dict):
            raise _expected("a table ([agents.<identity>])", table, f"{source}.{identity}")
    return value


def _env_layer(environ: Mapping[str, str]) -> _Layer:
    layer: _Layer = {}
    by_env = {s.env: s for s in settings()}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV_VAR or name in FOREIGN_ENV_VARS:
            continue
        setting = by_env.get(name)
        if setting is None:
            for table in (_AGENTS, SECURITY_TABLE, _ACL):
                if name.startswith(f"{ENV_PREFIX}{table.upper()}"):
                    raise ConfigError(_FILE_ONLY[table], source=name)
            raise ConfigError(
                f"unknown setting{_suggest(name, [*by_env, CONFIG_ENV_VAR])}", source=name
            )
        layer[setting.key] = (_convert(setting, environ[name], name), name)
    return layer


# --- conversion ---------------------------------------------------------------------------


def _convert(setting: Setting, value: object, source: str, *, typed: bool = False) -> object:
    """Check ``value`` and convert it to the setting's type.

    ``typed`` says the value comes from TOML, which has real types: there a string is
    never a number. Elsewhere (environment, flags) strings are parsed.
    """
    parse = isinstance(value, str) and not typed
    converted: object
    match setting.kind:
        case "str" | "optional_str":
            if not isinstance(value, str):
                raise _expected("a string", value, source)
            converted = value
        case "choice":
            if not isinstance(value, str):
                raise _expected(f"one of {_or_list(setting.choices)}", value, source)
            converted = value.lower() if setting.key == "log_level" else value
            if converted not in setting.choices:
                raise ConfigError(
                    f"must be one of {_or_list(setting.choices)}, not {value!r}", source=source
                )
        case "path":
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if not isinstance(value, str):
                raise _expected("a path (a string)", value, source)
            converted = Path(value).expanduser() if value else value
        case "bool":
            if isinstance(value, bool):
                converted = value
            elif parse and str(value).strip().lower() in _TRUE | _FALSE:
                converted = str(value).strip().lower() in _TRUE
            else:
                accepted = "true or false" if typed else "one of 1/0, true/false, yes/no, on/off"
                raise _expected(accepted, value, source)
        case "int":
            if isinstance(value, int) and not isinstance(value, bool):
                converted = value
            elif parse and _INT_RE.fullmatch(str(value).strip()):
                converted = int(str(value))
            else:
                raise _expected("an integer", value, source)
        case "float":
            converted = _to_float(value, source, parse=parse)
    _check(setting, converted, source)
    return converted


def _to_float(value: object, source: str, *, parse: bool) -> float:
    number: float
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif parse:
        try:
            number = float(str(value))
        except ValueError:
            raise _expected("a number", value, source) from None
    else:
        raise _expected("a number", value, source)
    if not math.isfinite(number):
        raise ConfigError(f"must be a finite number, not {value!r}", source=source)
    return number


def _check(setting: Setting, value: object, source: str) -> None:
    """The rules of single settings; rules spanning settings are in :func:`_build`."""
    if value == "":
        raise ConfigError("must not be empty", source=source)
    if setting.key == "port" and isinstance(value, int) and not 0 <= value <= 65535:
        raise ConfigError(f"must be between 0 and 65535, not {value}", source=source)
    limit = setting.table in ("limits", "channels", "tubes", "messaging", "event_log")
    limit = limit or setting.key == "failed_handshakes_per_minute"
    if limit and isinstance(value, int | float) and value <= 0:
        raise ConfigError(f"must be positive, not {value}", source=source)
    if setting.key == "broker_id" and not BROKER_ID_PATTERN.fullmatch(str(value)):
        raise ConfigError(
            f"must be 1 to 128 letters, digits, '.', '_' or '-', not {value!r}",
            source=source,
        )
    if setting.key == "authenticate_command" and isinstance(value, str):
        _check_authenticate_command(value, source)
    if setting.key == "redis_url" and isinstance(value, str):
        scheme = urllib.parse.urlsplit(value).scheme
        if scheme not in _REDIS_SCHEMES:
            raise ConfigError(
                f"must be a {_or_list(tuple(f'{s}://' for s in _REDIS_SCHEMES))} URL, "
                f"not {_mask_url(value)!r}",
                source=source,
            )


def _check_authenticate_command(name: str, source: str) -> None:
    if not is_bare(name):
        raise ConfigError(
            f"must be a Command-Name that can be written unquoted (no whitespace, controls "
            f"or any of {''.join(sorted(RESERVED))}), not {name!r}",
            source=source,
        )
    if name.startswith(_RESERVED_COMMAND_PREFIX):
        raise ConfigError(
            f"must not start with {_RESERVED_COMMAND_PREFIX!r}, which is reserved for the "
            f"broker's own Commands: {name!r}",
            source=source,
        )
    invisible = [char for char in name if unicodedata.category(char) == "Cf"]
    if invisible:
        # Bidi controls and zero-width characters (Trojan Source, CVE-2021-42574) would
        # make the name look like another one in this file, in logs and in ACLs.
        codes = ", ".join(f"U+{ord(char):04X}" for char in invisible)
        raise ConfigError(
            f"must not hold invisible formatting characters ({codes}): {name!r}",
            source=source,
        )


def _text_path(value: object, source: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _expected("a path (a string)", value, source)
    return value


# --- building the config ------------------------------------------------------------------


def _build(merged: _Layer, file: _File) -> GatewayConfig:
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for setting in settings():
        values[setting.key], sources[setting.key] = merged.get(
            setting.key, (setting.default, "default")
        )

    certfile, keyfile = values["tls.certfile"], values["tls.keyfile"]
    if (certfile is None) != (keyfile is None):
        given, missing = (
            ("tls.certfile", "tls.keyfile") if keyfile is None else ("tls.keyfile", "tls.certfile")
        )
        raise ConfigError(
            f"{given} needs {missing} as well ({_setting_names(missing)})", source=sources[given]
        )
    if isinstance(certfile, Path) and isinstance(keyfile, Path):
        _check_tls(certfile, keyfile, sources["tls.certfile"], sources["tls.keyfile"])

    host = str(values["host"])
    if values["insecure_dev_tubes"] and not _is_loopback(host):
        raise ConfigError(
            "insecure_dev_tubes is only allowed when host is a loopback address "
            f"(127.0.0.0/8, ::1 or localhost), and host is {host!r} "
            f"(from {sources['host']}): Tubes without TLS would carry agent credentials "
            "and Commands in clear text over the network",
            source=sources["insecure_dev_tubes"],
        )

    if file.agents:
        _check_agents(file, str(values["audience"]))
    authenticate_command = values["authenticate_command"]
    _check_serves(file, authenticate_command if isinstance(authenticate_command, str) else None)
    if file.acl is not None:
        _check_acl_agents(file, file.acl)

    kwargs: dict[str, Any] = {}
    tables: dict[str, dict[str, object]] = {}
    for setting in settings():
        if setting.table is None:
            kwargs[setting.key] = values[setting.key]
        else:
            tables.setdefault(setting.table, {})[setting.name] = values[setting.key]
    for table, fields in tables.items():
        if all(value is None for value in fields.values()):
            kwargs[table] = None  # an optional table left unset: tls
            continue
        try:
            kwargs[table] = _table_classes()[table](**fields)
        except (TypeError, ValueError) as exc:  # asbp.Limits checks its own fields again
            raise ConfigError(str(exc), source=f"[{table}]") from exc
    return GatewayConfig(**kwargs, agents=file.agents, agents_base_dir=file.base_dir, acl=file.acl)


def _check_tls(certfile: Path, keyfile: Path, cert_source: str, key_source: str) -> None:
    for path, what, source in (
        (certfile, "certificate", cert_source),
        (keyfile, "private key", key_source),
    ):
        if not path.is_file():
            raise ConfigError(f"the TLS {what} file {str(path)!r} does not exist", source=source)
    # Loading the pair now turns a bad PEM, a key that does not match the certificate or
    # a passphrase (which the servers cannot supply) into a ConfigError at start-up,
    # rather than a traceback once the server has started.
    import ssl  # only needed with TLS configured

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate and key: {exc}",
            source=cert_source if cert_source == key_source else f"{cert_source}, {key_source}",
        ) from exc


def _check_agents(file: _File, audience: str) -> None:
    # Imported here: the JOSE and crypto libraries cost start-up time that a broker
    # without Application-Agents (or `asbp config`) should not pay.
    from gateway.auth.credentials import AgentCredentials, CredentialConfigError

    try:
        AgentCredentials.from_config(
            {"audience": audience, _AGENTS: file.agents}, base_dir=file.base_dir
        )
    except CredentialConfigError as exc:
        raise ConfigError(str(exc), source=f"{file.name}:{_AGENTS}") from exc


def _check_serves(file: _File, authenticate_command: str | None) -> None:
    try:
        AgentTrust.from_agents_table(file.agents, authenticate_command)
    except ServeConfigError as exc:
        raise ConfigError(
            exc.detail, source=f"{file.name}:{_AGENTS}.{_toml_key(exc.identity)}.serves"
        ) from exc


def _check_acl_agents(file: _File, acl: Acl) -> None:
    # An identity misspelt in [security.agents] would not fail anywhere else: that
    # agent would silently be checked against the default policy.
    for identity in acl.agents:
        if identity in file.agents:
            continue
        line = key_lines(file.text).get((SECURITY_TABLE, "agents", identity))
        where = f"{file.name}:{line}" if line is not None else f"{file.name}:security.agents"
        configured = sorted(file.agents)
        known = (
            f"the configured agents are {', '.join(map(repr, configured))}"
            if configured
            else "no [agents.<identity>] is configured"
        )
        raise ConfigError(
            f"[security.agents] assigns a policy to {identity!r}, which is not a configured "
            f"Application-Agent ({known}){_suggest(identity, configured)}",
            source=where,
        )


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- describing the settings ---------------------------------------------------------------


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
    raise TypeError(f"gateway.config.settings cannot convert {key} of type {hint!r}; teach _kind")


def _table_class(hint: object) -> type | None:
    candidates = get_args(hint) if get_origin(hint) is types.UnionType else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


@functools.cache
def _table_classes() -> dict[str, type]:
    hints = get_type_hints(GatewayConfig)
    result: dict[str, type] = {}
    for field in dataclasses.fields(GatewayConfig):
        table_class = _table_class(hints[field.name])
        if table_class is not None:
            result[field.name] = table_class
    return result


@functools.cache
def _by_key() -> dict[str, Setting]:
    return {s.key: s for s in settings()}


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


def _first_sentence(doc: str) -> str:
    return doc.partition(". ")[0].rstrip(".").replace("``", "")


def _setting_names(key: str) -> str:
    setting = _by_key()[key]
    names = [f"{key} in the file", setting.env]
    if setting.flag:
        names.append(setting.flag)
    return ", ".join(names)


def _suggest(name: str, candidates: list[str]) -> str:
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {matches[0]}?)" if matches else ""


def _expected(what: str, value: object, source: str) -> ConfigError:
    return ConfigError(f"expected {what}, got {_describe(value)}", source=source)


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date | time):
        return f"the date/time {value.isoformat()}"
    return repr(value)


def _or_list(items: tuple[str, ...]) -> str:
    quoted = [repr(item) for item in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    username = userinfo.partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{username}:***@{hostinfo}"))


# --- writing the config and its reference ---------------------------------------------------


def config_to_dict(config: GatewayConfig) -> dict[str, Any]:
    """``config`` as plain data (tables as dicts, absolute paths as strings), secrets masked.

    The Redis password is the only secret a config holds: ``[agents]`` has public keys.
    ``security`` is a summary of the access-control lists (where they came from, the
    policy names, and who uses which), or ``None`` without any: an :class:`Acl` is
    compiled and keeps no copy of the table it was built from.
    """
    result: dict[str, Any] = {}
    for setting in settings():
        if setting.table is None:
            value = getattr(config, setting.key)
            result[setting.key] = _plain(setting, value)
            continue
        table_value = getattr(config, setting.table)
        table = result.setdefault(setting.table, None if table_value is None else {})
        if table is not None:
            table[setting.name] = _plain(setting, getattr(table_value, setting.name))
    result[_AGENTS] = dict(config.agents)
    result[_AGENTS_BASE_DIR] = str(config.agents_base_dir)
    result[SECURITY_TABLE] = None if config.acl is None else _acl_summary(config.acl)
    return result


def _acl_summary(acl: Acl) -> dict[str, Any]:
    return {
        "source": acl.source,
        "policies": list(acl.policy_names),
        "agents": dict(acl.agents),
        "roles": dict(acl.roles),
    }


def config_to_toml(config: GatewayConfig) -> str:
    """``config`` as a TOML file that :func:`load_config` reads back, secrets masked.

    The ``[security]`` table is summarised in comments, not written: loading the output
    gives the same configuration without access control, and the comments say so.
    """
    data = config_to_dict(config)
    lines = [
        "# The effective configuration: defaults < file < ASBP_* environment < flags.",
        "# Secrets are masked (***).",
    ]
    not_settings = (_AGENTS, _AGENTS_BASE_DIR, SECURITY_TABLE)
    for key, value in data.items():
        if key in not_settings or isinstance(value, dict):
            continue
        if value is None:
            lines.append(f"# {key} is unset" + _UNSET_NOTES.get(key, ""))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in data.items():
        if key in not_settings or value is None or not isinstance(value, dict):
            continue
        lines += ["", f"[{key}]", *(f"{k} = {_toml_value(v)}" for k, v in value.items())]
    if data[_AGENTS]:
        lines += ["", f"# Relative paths below resolve against {data[_AGENTS_BASE_DIR]}"]
        for identity, table in data[_AGENTS].items():
            lines.append(f"[{_AGENTS}.{_toml_key(identity)}]")
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    if data[SECURITY_TABLE] is not None:
        lines += ["", *_security_comments(data[SECURITY_TABLE])]
    return "\n".join(lines) + "\n"


def _security_comments(summary: Mapping[str, Any]) -> list[str]:
    # Every name goes through _toml_key/_toml_string: a quoted TOML key may hold a
    # newline, which written raw would end the comment and break the file.
    source = summary["source"]
    origin = "" if source is None else f" from {_toml_string(str(source))}"
    lines = [
        f"# [{SECURITY_TABLE}] (access control){origin} is not repeated here: copy it",
        "# from there. Without it, this file configures NO access control.",
        "#   policies: " + ", ".join(_toml_key(name) for name in summary["policies"]),
    ]
    for table in ("agents", "roles"):
        if summary[table]:
            pairs = ", ".join(
                f"{_toml_key(name)} = {_toml_string(policy)}"
                for name, policy in summary[table].items()
            )
            lines.append(f"#   {table}: {pairs}")
    return lines


def config_reference() -> str:
    """Every setting as Markdown: ``docs/configuration.md``."""
    lines = [_REFERENCE_INTRO.strip(), ""]
    for table in (None, *_table_classes()):
        if table is None:
            lines += ["## Top-level settings", ""]
        else:
            summary = inspect.getdoc(_table_classes()[table]) or ""
            lines += [f"## `[{table}]`", "", summary.splitlines()[0], ""]
        lines += [
            "| Key | Type | Default | Environment variable | Flag | Description |",
            "|-----|------|---------|----------------------|------|-------------|",
        ]
        for setting in settings():
            if setting.table != table:
                continue
            default = "unset" if setting.default is None else f"`{_toml_value(setting.default)}`"
            flag = f"`{setting.flag}`" if setting.flag else ""
            doc = setting.doc.replace("``", "`").replace("|", "\\|")
            lines.append(
                f"| `{setting.name}` | {_type_name(setting)} | {default} | `{setting.env}` "
                f"| {flag} | {doc} |"
            )
        lines.append("")
    lines += [_REFERENCE_AGENTS.strip(), ""]
    return "\n".join(lines)


def _plain(setting: Setting, value: object) -> object:
    if isinstance(value, Path):
        # Absolute, so the written config means the same wherever it is saved: relative
        # paths in a file resolve against that file's directory.
        return os.path.abspath(value)
    if setting.key == "redis_url" and isinstance(value, str):
        return _mask_url(value)
    return value


def _type_name(setting: Setting) -> str:
    if setting.kind == "choice":
        return ", ".join(f"`{choice}`" for choice in setting.choices)
    return {
        "str": "string",
        "optional_str": "string",
        "int": "integer",
        "float": "number",
        "bool": "boolean",
        "path": "path",
    }[setting.kind]


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    # JSON's escapes are all valid in a TOML basic string; DEL is the one control
    # character JSON leaves alone and TOML does not allow.
    return orjson.dumps(text).decode().replace("\x7f", "\\u007f")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return _toml_string(str(value))
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


_UNSET_NOTES: Final = {
    "broker_id": ": it is read from, or created in, data_dir/broker-id",
    "authenticate_command": ": Subjects are off",
}

_REFERENCE_INTRO: Final = """
# Configuration reference

<!-- Generated from the field docs in gateway/config/model.py by
     `python -m gateway.config.settings > docs/configuration.md`. Do not edit by hand:
     tests/gateway/config/test_settings.py fails when this file is out of date. -->

The broker reads its settings from four places, each overriding the one before:

1. the defaults below;
2. a TOML file, named by `--config FILE` or the `ASBP_CONFIG` variable;
3. `ASBP_*` environment variables;
4. command-line flags of `asbp broker` (also `asbp config`, which prints the result).

Nothing is silently ignored. An unknown key in the file, an unknown `ASBP_*` variable,
a value of the wrong type or out of range is an error that names where the value came
from (`broker.toml:channels.long_poll_timeout`, `ASBP_PORT`, `--port`), and the broker
exits with status 2. The one exception is `ASBP_TEST_TIMEOUT_UNIT`, which belongs to
the test suite.

- **File:** top-level keys, then one table per group: `[tls]`, `[limits]`,
  `[channels]`, `[tubes]`, `[messaging]`, `[event_log]`, `[agents.<identity>]` and
  `[security]`. Relative paths in the file resolve against the file's directory.
  `[agents]` and `[security]` can only be set in the file.
- **Environment:** `ASBP_` and the key in capitals; inside a table, the table and the
  key are joined by a double underscore (`ASBP_CHANNELS__LONG_POLL_TIMEOUT`), except
  for `ASBP_TLS_CERTFILE` and `ASBP_TLS_KEYFILE`. Booleans are `1`/`0`, `true`/`false`,
  `yes`/`no` or `on`/`off`. Relative paths resolve against the working directory.
- **Rules across settings:** `[tls]` needs both files, and they must load as a
  certificate and its key; `insecure_dev_tubes` is refused unless `host` is a loopback
  address (`127.0.0.0/8`, `::1`, `localhost`); every identity in `[security.agents]`
  must be a configured `[agents.<identity>]`.

```toml
host = "0.0.0.0"
port = 8443
data_dir = "/var/lib/asbp"

[tls]
certfile = "tls/broker.pem"
keyfile = "tls/broker.key"

[channels]
long_poll_timeout = 20.0
```
"""

_REFERENCE_AGENTS: Final = """
## `[agents.<identity>]`

Application-Agent identities and their public keys; an agent's credential must be
signed with one of its identity's keys and carry `audience` in `aud`. This table can
only be set in the TOML file, and relative key paths resolve against the file's
directory. See `AgentCredentials.from_config` in `gateway/auth/credentials.py`; the keys are
loaded and checked at start-up.

```toml
[agents.billing]
public_key = "keys/billing.pem"   # or a list of paths
kid = "billing-2025"              # optional, with one public_key

[agents.search]
jwks = "keys/search.jwks.json"    # a JWK or a JWKS

[agents.ledger]
jwk = { kty = "OKP", crv = "Ed25519", x = "..." }
serves = ['ledger\\.[a-z_]+', 'auth.login']   # optional allow-list
```

`serves` is the identity's allow-list of the Command-Names it may serve (register
for with `asbp.register`): regular expressions matched against the whole name, with
the same safety rules as ACL destinations ([docs/acl.md](acl.md)). A Tube that registers
anything else is refused with fault 3201 and the attempt is logged. Without
`serves`, an agent may serve any name except the Authenticate-Command
(`authenticate_command`), which an agent serves only when an entry of its `serves`
is that very name (`auth.login` or `auth\\.login`; a pattern that merely matches it,
such as `.*`, does not count). [docs/security.md](security.md) says why.

## `[security]`

The access-control lists: security policies, and which Application-Agent
identities and Subject roles use which. The format, the defaults and the order of
evaluation are in [docs/acl.md](acl.md). Without the table every request is allowed. A bad
policy stops start-up with a message that names the file and line
(`broker.toml:12: policy 'vip', entries[1]: ...`). `asbp config` prints a summary of
this table as comments, not the table itself.
"""


if __name__ == "__main__":
    sys.stdout.write(config_reference())
