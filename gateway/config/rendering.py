"""Write a configuration out: as plain data, as TOML, and as its reference.

``asbp config`` prints :func:`config_to_toml` (or :func:`config_to_dict` as JSON);
``docs/configuration.md`` is :func:`config_reference`, generated from the field docs
in :mod:`gateway.config.model`. Regenerate it with
``python -m gateway.config > docs/configuration.md``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from gateway.acl import SECURITY_TABLE, Acl
from gateway.config.fields import (
    AGENTS,
    AGENTS_BASE_DIR,
    COURSES,
    FOREIGN_ENV_VARS,
    Setting,
    settings,
    table_classes,
)
from gateway.config.model import GatewayConfig
from gateway.config.text import mask_url, toml_key, toml_string, toml_value

__all__ = ["config_reference", "config_to_dict", "config_to_toml"]


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
    result[AGENTS] = dict(config.agents)
    result[AGENTS_BASE_DIR] = str(config.agents_base_dir)
    result[COURSES] = dict(config.courses)
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
    not_settings = (AGENTS, AGENTS_BASE_DIR, SECURITY_TABLE, COURSES)
    for key, value in data.items():
        if key in not_settings or isinstance(value, dict):
            continue
        if value is None:
            lines.append(f"# {key} is unset" + _UNSET_NOTES.get(key, ""))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in data.items():
        if key in not_settings or value is None or not isinstance(value, dict):
            continue
        lines += [
            "",
            f"[{key}]",
            # A table's optional settings ([management] token_file) may be unset too.
            *(
                f"# {k} is unset" if v is None else f"{k} = {toml_value(v)}"
                for k, v in value.items()
            ),
        ]
    if data[AGENTS]:
        lines += ["", f"# Relative paths below resolve against {data[AGENTS_BASE_DIR]}"]
        for identity, table in data[AGENTS].items():
            lines.append(f"[{AGENTS}.{toml_key(identity)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    if data[COURSES]:
        lines += ["", f"[{COURSES}]"]
        peers = {k: v for k, v in data[COURSES].items() if isinstance(v, dict)}
        lines += [
            f"{toml_key(k)} = {toml_value(v)}"
            for k, v in data[COURSES].items()
            if not isinstance(v, dict)
        ]
        for domain, table in peers.items():
            lines.append(f"[{COURSES}.{toml_key(domain)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    if data[SECURITY_TABLE] is not None:
        lines += ["", *_security_comments(data[SECURITY_TABLE])]
    return "\n".join(lines) + "\n"


def _security_comments(summary: Mapping[str, Any]) -> list[str]:
    # Every name goes through _toml_key/_toml_string: a quoted TOML key may hold a
    # newline, which written raw would end the comment and break the file.
    source = summary["source"]
    origin = "" if source is None else f" from {toml_string(str(source))}"
    lines = [
        f"# [{SECURITY_TABLE}] (access control){origin} is not repeated here: copy it",
        "# from there. Without it, this file configures NO access control.",
        "#   policies: " + ", ".join(toml_key(name) for name in summary["policies"]),
    ]
    for table in ("agents", "roles"):
        if summary[table]:
            pairs = ", ".join(
                f"{toml_key(name)} = {toml_string(policy)}"
                for name, policy in summary[table].items()
            )
            lines.append(f"#   {table}: {pairs}")
    return lines


def config_reference() -> str:
    """Every setting as Markdown: ``docs/configuration.md``."""
    foreign = ", ".join(f"`{name}`" for name in sorted(FOREIGN_ENV_VARS))
    lines = [_REFERENCE_INTRO.strip().replace("{foreign}", foreign), ""]
    for table in (None, *table_classes()):
        if table is None:
            lines += ["## Top-level settings", ""]
        else:
            summary = inspect.getdoc(table_classes()[table]) or ""
            lines += [f"## `[{table}]`", "", summary.splitlines()[0], ""]
        lines += [
            "| Key | Type | Default | Environment variable | Flag | Description |",
            "|-----|------|---------|----------------------|------|-------------|",
        ]
        for setting in settings():
            if setting.table != table:
                continue
            default = "unset" if setting.default is None else f"`{toml_value(setting.default)}`"
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
        return mask_url(value)
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


_UNSET_NOTES: Final = {
    "broker_id": ": it is read from, or created in, data_dir/broker-id",
    "authenticate_command": ": Subjects are off",
}

_REFERENCE_INTRO: Final = """
# Configuration reference

<!-- Generated from the field docs in gateway/config/model.py by
     `python -m gateway.config > docs/configuration.md`. Do not edit by hand:
     tests/gateway/config/test_settings.py fails when this file is out of date. -->

The broker reads its settings from four places, each overriding the one before:

1. the defaults below;
2. a TOML file, named by `--config FILE` or the `ASBP_CONFIG` variable;
3. `ASBP_*` environment variables;
4. command-line flags of `asbp broker` (also `asbp config`, which prints the result).

Nothing is silently ignored. An unknown key in the file, an unknown `ASBP_*` variable,
a value of the wrong type or out of range is an error that names where the value came
from (`broker.toml:channels.long_poll_timeout`, `ASBP_PORT`, `--port`), and the broker
exits with status 2. The exceptions are the `ASBP_*` variables that belong to other
programs (the test suite's, the SDK's and the examples'), which the broker leaves alone:
{foreign}.

- **File:** top-level keys, then one table per group: `[tls]`, `[limits]`,
  `[channels]`, `[tubes]`, `[messaging]`, `[event_log]`, `[metrics]`, `[management]`,
  `[agents.<identity>]` and `[security]`. Relative paths in the file resolve against
  the file's directory. `[agents]` and `[security]` can only be set in the file.
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
