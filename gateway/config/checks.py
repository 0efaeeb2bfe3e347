"""The rules a configuration must follow, beyond each value's type.

:func:`check_value` holds the rules of one setting (a port in range, a positive limit,
a ``broker_id`` that is safe everywhere it is written); the loader runs it on every
value of every layer, so the error names the layer that broke the rule.
:func:`check_across` holds the rules that span settings or tables (TLS needs both
files, insecure Tubes need loopback, ``[security.agents]`` names configured agents);
the loader runs it once, on the merged values.

Every failure is a :class:`~gateway.config.errors.ConfigError` naming the source of the
value at fault.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from asbp.grammar import RESERVED, is_bare
from gateway.acl import SECURITY_TABLE, Acl
from gateway.acl.toml_lines import key_lines
from gateway.config.errors import ConfigError
from gateway.config.fields import AGENTS, Setting, setting_names
from gateway.config.text import mask_url, or_list, suggest, toml_key
from gateway.engines.redis.cluster_url import CLUSTER_SCHEMES, parse_cluster_url

__all__ = ["BROKER_ID_PATTERN", "check_across", "check_value"]

#: What a ``broker_id`` may look like: conservative, so it is safe as an ASBP header
#: value, in a URL, in a log line and as part of a file or Redis key name.
BROKER_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")

# The broker's own Command-Names (asbp.names.PREFIX); an
# Authenticate-Command there could never reach an agent.
_RESERVED_COMMAND_PREFIX: Final = "asbp."
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
# Tables whose numbers are sizes, counts or durations: zero or less means nothing.
_POSITIVE_TABLES: Final = ("limits", "channels", "tubes", "messaging", "event_log", "metrics")


def check_value(setting: Setting, value: object, source: str) -> None:
    """The rules of one setting, for ``value`` already converted to its type.

    Raises:
        ConfigError: ``value`` breaks a rule of ``setting``.
    """
    key = setting.key
    if value == "":
        raise ConfigError("must not be empty", source=source, key=key)
    if key == "port" and isinstance(value, int) and not 0 <= value <= 65535:
        raise ConfigError(f"must be between 0 and 65535, not {value}", source=source, key=key)
    limit = setting.table in _POSITIVE_TABLES or key in (
        "failed_handshakes_per_minute",
        "bus_lease",
        "drain_timeout",
    )
    # bool is an int to isinstance, and ``enabled = false`` is no limit.
    if limit and isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise ConfigError(f"must be positive, not {value}", source=source, key=key)
    if key == "broker_id" and not BROKER_ID_PATTERN.fullmatch(str(value)):
        raise ConfigError(
            f"must be 1 to 128 letters, digits, '.', '_' or '-', not {value!r}",
            source=source,
            key=key,
        )
    if key == "authenticate_command" and isinstance(value, str):
        _check_authenticate_command(value, source)
    if key == "redis_url" and isinstance(value, str):
        scheme = urllib.parse.urlsplit(value).scheme
        if scheme not in _REDIS_SCHEMES:
            raise ConfigError(
                f"must be a {or_list(tuple(f'{s}://' for s in _REDIS_SCHEMES))} URL, "
                f"not {mask_url(value)!r}",
                source=source,
                key=key,
            )
        if scheme in CLUSTER_SCHEMES:
            try:
                parse_cluster_url(value)
            except ValueError as exc:
                raise ConfigError(f"{exc} in {mask_url(value)!r}", source=source, key=key) from exc


def check_across(
    values: Mapping[str, object],
    sources: Mapping[str, str],
    *,
    file_name: str,
    text: str,
    base_dir: Path,
    agents: Mapping[str, Any],
    acl: Acl | None,
) -> None:
    """The rules that span settings and tables, on the merged configuration.

    Args:
        values: every setting's value by dotted key, defaults included.
        sources: where each value came from (``"default"`` for a default).
        file_name: the TOML file as it was named, for messages.
        text: the file's text, where errors find their lines.
        base_dir: the directory ``[agents]`` key paths resolve against.
        agents: the file's ``[agents]`` table.
        acl: the access-control lists of the file's ``[security]`` table, if any.

    Raises:
        ConfigError: the first rule broken, naming the source of the value at fault.
    """
    certfile, keyfile = values["tls.certfile"], values["tls.keyfile"]
    if (certfile is None) != (keyfile is None):
        given, missing = (
            ("tls.certfile", "tls.keyfile") if keyfile is None else ("tls.keyfile", "tls.certfile")
        )
        raise ConfigError(
            f"{given} needs {missing} as well ({setting_names(missing)})",
            source=sources[given],
            key=given,
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
            key="insecure_dev_tubes",
        )

    if agents:
        _check_agents(agents, base_dir, str(values["audience"]), file_name)
    authenticate_command = values["authenticate_command"]
    _check_serves(
        agents, authenticate_command if isinstance(authenticate_command, str) else None, file_name
    )
    if acl is not None:
        _check_acl_agents(acl, agents, text, file_name)


def _check_authenticate_command(name: str, source: str) -> None:
    key = "authenticate_command"
    if not is_bare(name):
        raise ConfigError(
            f"must be a Command-Name that can be written unquoted (no whitespace, controls "
            f"or any of {''.join(sorted(RESERVED))}), not {name!r}",
            source=source,
            key=key,
        )
    if name.startswith(_RESERVED_COMMAND_PREFIX):
        raise ConfigError(
            f"must not start with {_RESERVED_COMMAND_PREFIX!r}, which is reserved for the "
            f"broker's own Commands: {name!r}",
            source=source,
            key=key,
        )
    invisible = [char for char in name if unicodedata.category(char) == "Cf"]
    if invisible:
        # Bidi controls and zero-width characters (Trojan Source, CVE-2021-42574) would
        # make the name look like another one in this file, in logs and in ACLs.
        codes = ", ".join(f"U+{ord(char):04X}" for char in invisible)
        raise ConfigError(
            f"must not hold invisible formatting characters ({codes}): {name!r}",
            source=source,
            key=key,
        )


def _check_tls(certfile: Path, keyfile: Path, cert_source: str, key_source: str) -> None:
    for path, what, source, key in (
        (certfile, "certificate", cert_source, "tls.certfile"),
        (keyfile, "private key", key_source, "tls.keyfile"),
    ):
        if not path.is_file():
            raise ConfigError(
                f"the TLS {what} file {str(path)!r} does not exist", source=source, key=key
            )
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
            key="tls",
        ) from exc


def _check_agents(agents: Mapping[str, Any], base_dir: Path, audience: str, file_name: str) -> None:
    # Imported here: the JOSE and crypto libraries cost start-up time that a broker
    # without Application-Agents (or `asbp config`) should not pay.
    from gateway.auth.credentials import AgentCredentials, CredentialConfigError

    try:
        AgentCredentials.from_config({"audience": audience, AGENTS: agents}, base_dir=base_dir)
    except CredentialConfigError as exc:
        raise ConfigError(str(exc), source=f"{file_name}:{AGENTS}", key=AGENTS) from exc


def _check_serves(
    agents: Mapping[str, Any], authenticate_command: str | None, file_name: str
) -> None:
    # Imported here: gateway.auth.trust imports gateway.config.model, and so this
    # package, which must be importable from it without a cycle.
    from gateway.auth.trust import SERVES_KEY, AgentTrust, ServeConfigError

    try:
        AgentTrust.from_agents_table(agents, authenticate_command)
    except ServeConfigError as exc:
        key = f"{AGENTS}.{toml_key(exc.identity)}.{SERVES_KEY}"
        raise ConfigError(exc.detail, source=f"{file_name}:{key}", key=key) from exc


def _check_acl_agents(acl: Acl, agents: Mapping[str, Any], text: str, file_name: str) -> None:
    # An identity misspelt in [security.agents] would not fail anywhere else: that
    # agent would silently be checked against the default policy.
    for identity in acl.agents:
        if identity in agents:
            continue
        line = key_lines(text).get((SECURITY_TABLE, "agents", identity))
        where = f"{file_name}:{line}" if line is not None else f"{file_name}:security.agents"
        configured = sorted(agents)
        known = (
            f"the configured agents are {', '.join(map(repr, configured))}"
            if configured
            else "no [agents.<identity>] is configured"
        )
        raise ConfigError(
            f"[security.agents] assigns a policy to {identity!r}, which is not a configured "
            f"Application-Agent ({known}){suggest(identity, configured)}",
            source=where,
            key=f"{SECURITY_TABLE}.agents",
            line=line,
        )


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
