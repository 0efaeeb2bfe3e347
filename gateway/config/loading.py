"""Load a :class:`~gateway.config.model.GatewayConfig` from a TOML file, ``ASBP_*`` and flags.

Theory of operation
-------------------
Every setting is described once, by a :class:`~gateway.config.fields.Setting`. Loading
reads four layers, lowest precedence first::

    defaults  <  TOML file  <  ASBP_* environment  <  flags (or an overrides mapping)

Each layer yields ``{key: (value, source)}`` with the value already converted to the
field's type and checked against that setting's own rules
(:func:`~gateway.config.checks.check_value`), where ``source`` says where it came from:
``broker.toml:port``, ``ASBP_PORT`` or ``--port``. The layers are merged key by key,
then the rules that span settings run (:func:`~gateway.config.checks.check_across`:
TLS needs both files, insecure Tubes need loopback, ...) and the frozen dataclasses are
built. Every error is a :class:`~gateway.config.errors.ConfigError` that names the
source of the offending value. Nothing is ignored: an unknown key in the file, an
unknown ``ASBP_*`` variable or an unknown override is an error, with a suggestion when
it looks like a typo.

Relative paths in the TOML file (``data_dir``, the TLS files, the key files of
``[agents]``) resolve against the file's directory, wherever the broker was started
from. Relative paths from the environment or flags resolve against the working
directory, as a shell user expects.

Two tables are not settings and can only come from the file: ``[agents.<identity>]``
(keys, checked by :mod:`gateway.auth.credentials`, and the ``serves`` allow-list, checked
by :mod:`gateway.auth.trust`) and ``[security]`` (the access-control lists, built by
:func:`gateway.acl.acl_from_config` from the file's text, so an error names its line).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from gateway.acl import SECURITY_TABLE, Acl, AclConfigError, acl_from_config
from gateway.config.checks import check_across, check_value
from gateway.config.errors import ConfigError, expected
from gateway.config.fields import (
    ACL,
    AGENTS,
    AGENTS_BASE_DIR,
    CONFIG_ENV_VAR,
    COURSES,
    ENV_PREFIX,
    FOREIGN_ENV_VARS,
    Setting,
    by_key,
    settings,
    table_classes,
)
from gateway.config.model import GatewayConfig
from gateway.config.text import or_list, suggest

__all__ = ["add_arguments", "load_config"]

_SECURITY_FILE_ONLY: Final = (
    f"unknown setting: the [{SECURITY_TABLE}] table (access control) can only be set in "
    "the TOML file"
)
# What to say when a table that only the file can hold is set elsewhere.
_FILE_ONLY: Final = {
    AGENTS: "unknown setting: the [agents] table can only be set in the TOML file",
    SECURITY_TABLE: _SECURITY_FILE_ONLY,
    ACL: _SECURITY_FILE_ONLY,
    COURSES: "unknown setting: the [courses] table can only be set in the TOML file",
}
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_INT_RE: Final = re.compile(r"[+-]?[0-9]+")


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


def _first_sentence(doc: str) -> str:
    return doc.partition(". ")[0].rstrip(".").replace("``", "")


# --- the layers ---------------------------------------------------------------------------

_Layer = dict[str, tuple[object, str]]


@dataclasses.dataclass(slots=True)
class _File:
    """What the TOML file contributed."""

    layer: _Layer = dataclasses.field(default_factory=dict)
    agents: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The [courses] table, checked when the broker builds its Courses (courses.settings).
    courses: dict[str, Any] = dataclasses.field(default_factory=dict)
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
    known_keys = by_key()
    for key, value in overrides.items():
        source = f"override {key!r}"
        if value is None:
            continue
        if key == "config":
            config_path = (_text_path(value, source), source)
            continue
        known = known_keys.get(key)
        if known is None:
            if key in (AGENTS, ACL, SECURITY_TABLE):
                raise ConfigError(_FILE_ONLY[key], source=source, key=key)
            raise ConfigError(
                f"unknown setting{suggest(key, [*known_keys, 'config'])}", source=source, key=key
            )
        layer[key] = (_convert(known, value, source), source)
    return layer, config_path


def _read_file(raw_path: str, named_by: str) -> _File:
    if not raw_path:
        raise ConfigError("the config file name must not be empty", source=named_by)
    path = Path(raw_path).expanduser()
    try:
        # Read as text once: tomllib parses it, and the [security] loader and the
        # checks find lines in it.
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
    known_keys = by_key()
    tables = sorted({s.table for s in settings() if s.table is not None})
    for key, value in data.items():
        if key in known_keys:
            _file_value(file, known_keys[key], value)
        elif key in tables:
            if not isinstance(value, dict):
                raise expected("a table", value, f"{raw_path}:{key}", key=key)
            for name, item in value.items():
                setting = known_keys.get(f"{key}.{name}")
                if setting is None:
                    names = [s.name for s in settings() if s.table == key]
                    raise ConfigError(
                        f"unknown setting{suggest(name, names)}",
                        source=f"{raw_path}:{key}.{name}",
                        key=f"{key}.{name}",
                    )
                _file_value(file, setting, item)
        elif key == AGENTS:
            file.agents = _agents_table(value, f"{raw_path}:{key}")
        elif key == COURSES:
            if not isinstance(value, dict):
                raise expected("a table", value, f"{raw_path}:{key}", key=key)
            file.courses = value
        elif key == SECURITY_TABLE:
            file.acl = _security_table(data, file)
        elif key in (AGENTS_BASE_DIR, ACL):
            detail = (
                "cannot be set: it is the directory this file is in"
                if key == AGENTS_BASE_DIR
                else f"cannot be set: write the access-control lists in [{SECURITY_TABLE}]"
            )
            raise ConfigError(detail, source=f"{raw_path}:{key}", key=key)
        else:
            known = [
                *(s.key for s in settings() if s.table is None),
                *tables,
                AGENTS,
                COURSES,
                SECURITY_TABLE,
            ]
            what = "table" if isinstance(value, dict) else "setting"
            raise ConfigError(
                f"unknown {what}{suggest(key, known)}", source=f"{raw_path}:{key}", key=key
            )
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
        raise ConfigError(exc.detail, source=where, key=SECURITY_TABLE, line=exc.line) from exc


def _agents_table(value: object, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise expected("a table of agent identities", value, source, key=AGENTS)
    for identity, table in value.items():
        if not isinstance(table, dict):
            raise expected(
                "a table ([agents.<identity>])", table, f"{source}.{identity}", key=AGENTS
            )
    return value


def _env_layer(environ: Mapping[str, str]) -> _Layer:
    layer: _Layer = {}
    by_env = {s.env: s for s in settings()}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV_VAR or name in FOREIGN_ENV_VARS:
            continue
        setting = by_env.get(name)
        if setting is None:
            for table in (AGENTS, SECURITY_TABLE, ACL, COURSES):
                if name.startswith(f"{ENV_PREFIX}{table.upper()}"):
                    raise ConfigError(_FILE_ONLY[table], source=name, key=table)
            raise ConfigError(
                f"unknown setting{suggest(name, [*by_env, CONFIG_ENV_VAR])}", source=name
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
    key = setting.key
    converted: object
    match setting.kind:
        case "str" | "optional_str":
            if not isinstance(value, str):
                raise expected("a string", value, source, key=key)
            converted = value
        case "choice":
            if not isinstance(value, str):
                raise expected(f"one of {or_list(setting.choices)}", value, source, key=key)
            converted = value.lower() if key == "log_level" else value
            if converted not in setting.choices:
                raise ConfigError(
                    f"must be one of {or_list(setting.choices)}, not {value!r}",
                    source=source,
                    key=key,
                )
        case "path":
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if not isinstance(value, str):
                raise expected("a path (a string)", value, source, key=key)
            converted = Path(value).expanduser() if value else value
        case "bool":
            if isinstance(value, bool):
                converted = value
            elif parse and str(value).strip().lower() in _TRUE | _FALSE:
                converted = str(value).strip().lower() in _TRUE
            else:
                accepted = "true or false" if typed else "one of 1/0, true/false, yes/no, on/off"
                raise expected(accepted, value, source, key=key)
        case "int":
            if isinstance(value, int) and not isinstance(value, bool):
                converted = value
            elif parse and _INT_RE.fullmatch(str(value).strip()):
                converted = int(str(value))
            else:
                raise expected("an integer", value, source, key=key)
        case "float":
            converted = _to_float(value, source, key, parse=parse)
    check_value(setting, converted, source)
    return converted


def _to_float(value: object, source: str, key: str, *, parse: bool) -> float:
    number: float
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif parse:
        try:
            number = float(str(value))
        except ValueError:
            raise expected("a number", value, source, key=key) from None
    else:
        raise expected("a number", value, source, key=key)
    if not math.isfinite(number):
        raise ConfigError(f"must be a finite number, not {value!r}", source=source, key=key)
    return number


def _text_path(value: object, source: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise expected("a path (a string)", value, source, key="config")
    return value


# --- building the config ------------------------------------------------------------------


def _build(merged: _Layer, file: _File) -> GatewayConfig:
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for setting in settings():
        values[setting.key], sources[setting.key] = merged.get(
            setting.key, (setting.default, "default")
        )
    check_across(
        values,
        sources,
        file_name=file.name,
        text=file.text,
        base_dir=file.base_dir,
        agents=file.agents,
        acl=file.acl,
    )

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
            kwargs[table] = table_classes()[table](**fields)
        except (TypeError, ValueError) as exc:  # asbp.Limits checks its own fields again
            raise ConfigError(str(exc), source=f"[{table}]", key=table) from exc
    return GatewayConfig(
        **kwargs,
        agents=file.agents,
        agents_base_dir=file.base_dir,
        acl=file.acl,
        courses=file.courses,
    )
