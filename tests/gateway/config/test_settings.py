"""Tests for gateway.config (and gateway.broker_id): real TOML files, plain environ dicts.

Every source of a setting is exercised, every error path is asserted to name its source,
and docs/configuration.md is checked against the generator.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import asbp
from asbp import AsbpError
from gateway.broker_id import BROKER_ID_FILE, broker_identity
from gateway.config import (
    ConfigError,
    add_arguments,
    config_reference,
    config_to_dict,
    config_to_toml,
    load_config,
)
from gateway.config.fields import settings
from gateway.config.model import (
    ChannelLimits,
    EventLogConfig,
    GatewayConfig,
    ManagementConfig,
    MessagingLimits,
    MetricsConfig,
    TlsConfig,
    TubeLimits,
)
from tests.support import T, TlsFiles, generate_tls_files

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return generate_tls_files(tmp_path_factory.mktemp("tls"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def config_error(
    overrides: argparse.Namespace | dict[str, object] | None = None,
    environ: dict[str, str] | None = None,
) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides, environ={} if environ is None else environ)
    return info.value


# --- defaults and precedence ---------------------------------------------------------------


def test_no_sources_give_the_dataclass_defaults() -> None:
    assert load_config(environ={}) == GatewayConfig()
    assert load_config(parse_flags(), environ={}) == GatewayConfig()


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    file = write(
        tmp_path / "broker.toml",
        """
        port = 1001
        host = "127.0.0.2"
        engine = "redis"
        [channels]
        long_poll_timeout = 5
        max_in_flight = 7
        """,
    )
    environ = {"ASBP_CONFIG": str(file), "ASBP_PORT": "1002", "ASBP_CHANNELS__MAX_IN_FLIGHT": "8"}

    config = load_config({"port": 1003}, environ=environ)

    assert config.port == 1003  # flag > env > file
    assert config.channels.max_in_flight == 8  # env > file
    assert config.channels.long_poll_timeout == 5.0  # file > default, int accepted as float
    assert (config.host, config.engine) == ("127.0.0.2", "redis")
    assert config.channels.outbox_frames == ChannelLimits().outbox_frames  # default


def test_config_flag_wins_over_the_config_variable(tmp_path: Path) -> None:
    flag_file = write(tmp_path / "flag.toml", "port = 1\n")
    env_file = write(tmp_path / "env.toml", "port = 2\n")

    config = load_config(
        parse_flags("--config", str(flag_file)), environ={"ASBP_CONFIG": str(env_file)}
    )

    assert config.port == 1


def test_every_flag(tmp_path: Path, tls_files: TlsFiles) -> None:
    namespace = parse_flags(
        "--host", "::1",
        "--port", "0",
        "--server", "uvicorn",
        "--tls-cert", str(tls_files.cert),
        "--tls-key", str(tls_files.key),
        "--broker-id", "broker-7.eu",
        "--data-dir", str(tmp_path / "data"),
        "--engine", "redis",
        "--redis-url", "rediss://redis.internal:6380/2",
        "--insecure-dev-tubes",
        "--authenticate-command", "auth.login",
        "--failed-handshakes-per-minute", "3",
        "--log-format", "text",
        "--log-level", "WARNING",
    )  # fmt: skip

    config = load_config(namespace, environ={})

    assert config == GatewayConfig(
        host="::1",
        port=0,
        server="uvicorn",
        tls=TlsConfig(certfile=tls_files.cert, keyfile=tls_files.key),
        broker_id="broker-7.eu",
        data_dir=tmp_path / "data",
        engine="redis",
        redis_url="rediss://redis.internal:6380/2",
        insecure_dev_tubes=True,
        authenticate_command="auth.login",
        failed_handshakes_per_minute=3,
        log_format="text",
        log_level="warning",
    )


def test_a_boolean_flag_can_switch_off_what_the_environment_switched_on() -> None:
    environ = {"ASBP_INSECURE_DEV_TUBES": "1"}
    assert load_config(parse_flags(), environ=environ).insecure_dev_tubes is True
    flags = parse_flags("--no-insecure-dev-tubes")
    assert load_config(flags, environ=environ).insecure_dev_tubes is False


def test_every_environment_variable(tmp_path: Path, tls_files: TlsFiles) -> None:
    environ = {
        "ASBP_HOST": "localhost",
        "ASBP_PORT": "+8443",
        "ASBP_SERVER": "uvicorn",
        "ASBP_BROKER_ID": "b1",
        "ASBP_DATA_DIR": str(tmp_path),
        "ASBP_ENGINE": "redis",
        "ASBP_REDIS_URL": "unix:///run/redis.sock",
        "ASBP_TLS_CERTFILE": str(tls_files.cert),
        "ASBP_TLS_KEYFILE": str(tls_files.key),
        "ASBP_AUDIENCE": "bus.example.org",
        "ASBP_INSECURE_DEV_TUBES": " Yes ",
        "ASBP_AUTHENTICATE_COMMAND": "sign-in",
        "ASBP_FAILED_HANDSHAKES_PER_MINUTE": "20",
        "ASBP_LOG_FORMAT": "text",
        "ASBP_LOG_LEVEL": "Debug",
        "ASBP_LIMITS__MAX_FRAME_BYTES": "1024",
        "ASBP_LIMITS__MAX_HEADER_BYTES": "512",
        "ASBP_LIMITS__MAX_KEYS": "8",
        "ASBP_LIMITS__MAX_LIST_ITEMS": "9",
        "ASBP_CHANNELS__OUTBOX_FRAMES": "10",
        "ASBP_CHANNELS__OUTBOX_BYTES": "11",
        "ASBP_CHANNELS__MAX_IN_FLIGHT": "12",
        "ASBP_CHANNELS__LONG_POLL_TIMEOUT": "0.5",
        "ASBP_CHANNELS__LONG_POLL_MAX_FRAMES": "13",
        "ASBP_CHANNELS__HTTP_IDLE_TIMEOUT": "1e2",
        "ASBP_TUBES__OUTBOX_FRAMES": "14",
        "ASBP_TUBES__OUTBOX_BYTES": "15",
        "ASBP_TUBES__RESPONDENT_TIMEOUT": "16",
        "ASBP_MESSAGING__MAX_QUEUES": "17",
        "ASBP_MESSAGING__ACK_TIMEOUT": "0.25",
        "ASBP_MESSAGING__DEFAULT_TTL": "18",
        "ASBP_MESSAGING__MAX_DELIVERIES": "19",
        "ASBP_MESSAGING__MAX_QUEUE_DEPTH": "20",
        "ASBP_MESSAGING__MAX_SUBSCRIPTIONS": "21",
        "ASBP_MESSAGING__PREFETCH": "22",
        "ASBP_MESSAGING__MAX_PENDING": "23",
        "ASBP_MESSAGING__MAX_POLL_WAIT": "24",
        "ASBP_MESSAGING__SYSTEM_TOPIC_INTERVAL": "2.5",
        "ASBP_TEST_TIMEOUT_UNIT": "3",  # the test suite's own variable: left alone
        "PATH": "/usr/bin",  # not ours
    }

    config = load_config(environ=environ)

    assert config == GatewayConfig(
        host="localhost",
        port=8443,
        server="uvicorn",
        tls=TlsConfig(certfile=tls_files.cert, keyfile=tls_files.key),
        broker_id="b1",
        data_dir=tmp_path,
        engine="redis",
        redis_url="unix:///run/redis.sock",
        limits=asbp.Limits(
            max_frame_bytes=1024, max_header_bytes=512, max_keys=8, max_list_items=9
        ),
        channels=ChannelLimits(
            outbox_frames=10,
            outbox_bytes=11,
            max_in_flight=12,
            long_poll_timeout=0.5,
            long_poll_max_frames=13,
            http_idle_timeout=100.0,
        ),
        tubes=TubeLimits(outbox_frames=14, outbox_bytes=15, respondent_timeout=16.0),
        messaging=MessagingLimits(
            max_queues=17,
            ack_timeout=0.25,
            default_ttl=18.0,
            max_deliveries=19,
            max_queue_depth=20,
            max_subscriptions=21,
            prefetch=22,
            max_pending=23,
            max_poll_wait=24.0,
            system_topic_interval=2.5,
        ),
        audience="bus.example.org",
        insecure_dev_tubes=True,
        authenticate_command="sign-in",
        failed_handshakes_per_minute=20,
        log_format="text",
        log_level="debug",
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("1", True), ("true", True), ("ON", True), ("yes", True)],
        *[("0", False), ("False", False), ("off", False), ("no", False)],
    ],
)
def test_boolean_spellings_in_the_environment(raw: str, expected: bool) -> None:
    environ = {"ASBP_INSECURE_DEV_TUBES": raw}
    assert load_config(environ=environ).insecure_dev_tubes is expected


def test_overrides_accept_typed_values_and_strings(tmp_path: Path) -> None:
    config = load_config(
        {
            "port": "0",
            "data_dir": tmp_path,
            "channels.long_poll_timeout": 2,
            "tubes.respondent_timeout": "2.5",
            "insecure_dev_tubes": "true",
            "limits.max_keys": 3,
            "broker_id": None,  # None means "not given"
        },
        environ={"ASBP_BROKER_ID": "from-env"},
    )
    assert (config.port, config.data_dir) == (0, tmp_path)
    assert (config.channels.long_poll_timeout, config.tubes.respondent_timeout) == (2.0, 2.5)
    assert (config.insecure_dev_tubes, config.limits.max_keys) == (True, 3)
    assert config.broker_id == "from-env"


# --- the TOML file ------------------------------------------------------------------------


def test_a_full_file(tmp_path: Path, tls_files: TlsFiles) -> None:
    file = write(
        tmp_path / "broker.toml",
        f"""
        host = "127.0.0.1"
        port = 0
        server = "uvicorn"
        broker_id = "b-1"
        data_dir = "{tmp_path / "data"}"
        engine = "memory"
        redis_url = "redis://:secret@127.0.0.1:6379/1"
        audience = "aud"
        insecure_dev_tubes = true
        authenticate_command = "sessão.abrir"
        failed_handshakes_per_minute = 1
        log_format = "text"
        log_level = "error"

        [tls]
        certfile = "{tls_files.cert}"
        keyfile = "{tls_files.key}"

        [limits]
        max_frame_bytes = 100
        max_header_bytes = 50
        max_keys = 5
        max_list_items = 6

        [channels]
        outbox_frames = 1
        outbox_bytes = 2
        max_in_flight = 3
        long_poll_timeout = 4.5
        long_poll_max_frames = 5
        http_idle_timeout = 6

        [tubes]
        outbox_frames = 7
        outbox_bytes = 8
        respondent_timeout = 9.25
        """,
    )

    config = load_config({"config": file}, environ={})

    assert config == GatewayConfig(
        port=0,
        server="uvicorn",
        tls=TlsConfig(certfile=tls_files.cert, keyfile=tls_files.key),
        broker_id="b-1",
        data_dir=tmp_path / "data",
        redis_url="redis://:secret@127.0.0.1:6379/1",
        limits=asbp.Limits(max_frame_bytes=100, max_header_bytes=50, max_keys=5, max_list_items=6),
        channels=ChannelLimits(1, 2, 3, 4.5, 5, 6.0),
        tubes=TubeLimits(7, 8, 9.25),
        audience="aud",
        agents_base_dir=tmp_path,
        insecure_dev_tubes=True,
        authenticate_command="sessão.abrir",
        failed_handshakes_per_minute=1,
        log_format="text",
        log_level="error",
    )


def test_relative_paths_in_the_file_resolve_against_its_directory(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    conf = tmp_path / "etc" / "asbp"
    (conf / "tls").mkdir(parents=True)
    (conf / "tls" / "cert.pem").write_bytes(tls_files.cert.read_bytes())
    (conf / "tls" / "key.pem").write_bytes(tls_files.key.read_bytes())
    file = write(
        conf / "broker.toml",
        'data_dir = "state"\n[tls]\ncertfile = "tls/cert.pem"\nkeyfile = "tls/key.pem"\n',
    )

    # Named by a relative path from elsewhere: still resolved against the file's directory.
    config = load_config({"config": os.path.relpath(file)}, environ={})

    assert config.data_dir == conf.absolute() / "state"
    assert config.tls == TlsConfig(
        conf.absolute() / "tls/cert.pem", conf.absolute() / "tls/key.pem"
    )
    assert config.agents_base_dir == conf.absolute()


def test_relative_paths_from_the_environment_and_flags_stay_relative() -> None:
    config = load_config({"data_dir": "here"}, environ={})
    assert config.data_dir == Path("here")
    assert load_config(environ={"ASBP_DATA_DIR": "there"}).data_dir == Path("there")


def test_agents_table_is_passed_through_and_its_keys_are_checked(tmp_path: Path) -> None:
    public_pem = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    conf = tmp_path / "conf"
    (conf / "keys").mkdir(parents=True)
    (conf / "keys" / "billing.pem").write_bytes(public_pem)
    file = write(
        conf / "broker.toml",
        'audience = "bus"\n[agents.billing]\npublic_key = "keys/billing.pem"\nkid = "b-2025"\n',
    )

    config = load_config({"config": file}, environ={})

    assert config.agents == {"billing": {"public_key": "keys/billing.pem", "kid": "b-2025"}}
    assert config.agents_base_dir == conf
    # The broker builds its registry the same way; the settings already proved it works.
    from gateway.auth.credentials import AgentCredentials

    registry = AgentCredentials.from_config(
        {"audience": config.audience, "agents": config.agents}, base_dir=config.agents_base_dir
    )
    assert registry.identities == frozenset({"billing"})


# --- errors: each one names its source -------------------------------------------------------

FILE_ERRORS = [
    ("prot = 1", "broker.toml:prot: unknown setting (did you mean port?)"),
    ("[chanels]\nmax_in_flight = 1", "broker.toml:chanels: unknown table (did you mean channels?)"),
    (
        "[channels]\nlong_pol_timeout = 1",
        "broker.toml:channels.long_pol_timeout: unknown setting (did you mean long_poll_timeout?)",
    ),
    ("[tls]\ncert = 'a'", "broker.toml:tls.cert: unknown setting"),
    ("tls = 'yes'", "broker.toml:tls: expected a table, got 'yes'"),
    ("[port]\nvalue = 1", "broker.toml:port: expected an integer, got a table"),
    ('port = "8080"', "broker.toml:port: expected an integer, got '8080'"),
    ("port = 80.0", "broker.toml:port: expected an integer, got 80.0"),
    ("port = true", "broker.toml:port: expected an integer, got true"),
    ("port = 65536", "broker.toml:port: must be between 0 and 65535, not 65536"),
    ("port = -1", "broker.toml:port: must be between 0 and 65535, not -1"),
    ("host = 127", "broker.toml:host: expected a string, got 127"),
    ('host = ""', "broker.toml:host: must not be empty"),
    ("data_dir = ['a']", "broker.toml:data_dir: expected a path (a string), got a list"),
    ('insecure_dev_tubes = "yes"', "broker.toml:insecure_dev_tubes: expected true or false"),
    ('server = "gunicorn"', "broker.toml:server: must be one of 'auto', 'hypercorn' or 'uvicorn'"),
    ("engine = 1", "broker.toml:engine: expected one of 'memory' or 'redis', got 1"),
    ('log_level = "loud"', "broker.toml:log_level: must be one of 'debug', 'info', "),
    ("log_level = 1979-05-27", "broker.toml:log_level: expected one of"),
    ('broker_id = "a b"', "broker.toml:broker_id: must be 1 to 128 letters, digits"),
    ('redis_url = "http://u:pw@h"', "broker.toml:redis_url: must be a 'redis://'"),
    ("[limits]\nmax_keys = 0", "broker.toml:limits.max_keys: must be positive, not 0"),
    (
        "[channels]\nlong_poll_timeout = -1.5",
        "broker.toml:channels.long_poll_timeout: must be positive, not -1.5",
    ),
    ("[channels]\nlong_poll_timeout = inf", "broker.toml:channels.long_poll_timeout: must be a"),
    (
        "[channels]\nlong_poll_timeout = '1'",
        "broker.toml:channels.long_poll_timeout: expected a number, got '1'",
    ),
    ("agents_base_dir = '/x'", "broker.toml:agents_base_dir: cannot be set"),
    ("agents = 1", "broker.toml:agents: expected a table of agent identities, got 1"),
    ("[agents]\nbilling = 'key.pem'", "broker.toml:agents.billing: expected a table"),
    ("[agents.billing]\npublic_key = 'nope.pem'", "broker.toml:agents: agent 'billing'"),
    ("[agents.billing]\npublic-key = 'a.pem'", "broker.toml:agents: agent 'billing'"),
    ("port = ", "broker.toml: not valid TOML: "),
    (
        'authenticate_command = "asbp.login"',
        "broker.toml:authenticate_command: must not start with 'asbp.', which is reserved",
    ),
    (
        'authenticate_command = "log in"',
        "broker.toml:authenticate_command: must be a Command-Name that can be written unquoted",
    ),
    ("authenticate_command = 'a;b'", "broker.toml:authenticate_command: must be a Command-Name"),
    ("authenticate_command = '[a]'", "broker.toml:authenticate_command: must be a Command-Name"),
    (
        'authenticate_command = "log\\u200bin"',
        "broker.toml:authenticate_command: must not hold invisible formatting characters (U+200B)",
    ),
    (
        'authenticate_command = "auth\\u202e.login"',
        "broker.toml:authenticate_command: must not hold invisible formatting characters (U+202E)",
    ),
    ('authenticate_command = ""', "broker.toml:authenticate_command: must not be empty"),
    ("authenticate_command = 1", "broker.toml:authenticate_command: expected a string, got 1"),
    (
        "failed_handshakes_per_minute = 0",
        "broker.toml:failed_handshakes_per_minute: must be positive, not 0",
    ),
    (
        "failed_handshakes_per_minute = 2.5",
        "broker.toml:failed_handshakes_per_minute: expected an integer, got 2.5",
    ),
    ("acl = 1", "broker.toml:acl: cannot be set: write the access-control lists in [security]"),
    ("[securty]", "broker.toml:securty: unknown table (did you mean security?)"),
]


@pytest.mark.parametrize(("text", "message"), FILE_ERRORS)
def test_file_errors_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    file = write(tmp_path / "broker.toml", text + "\n")

    error = config_error({"config": str(file)})

    assert f"{tmp_path}/{message}" in str(error)
    assert isinstance(error, ValueError)


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    file = tmp_path / "broker.toml"
    file.write_bytes(b'host = "\xff"\n')
    assert str(config_error({"config": str(file)})).startswith(f"{file}: not valid TOML")


def test_a_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    error = config_error(parse_flags("--config", missing))
    assert str(error) == f"--config: config file {missing!r} does not exist"
    error = config_error(environ={"ASBP_CONFIG": missing})
    assert str(error) == f"ASBP_CONFIG: config file {missing!r} does not exist"


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    error = config_error({"config": str(tmp_path)})  # a directory
    assert str(error).startswith(f"override 'config': cannot read config file {str(tmp_path)!r}")


def test_an_empty_file_name() -> None:
    error = config_error(environ={"ASBP_CONFIG": ""})
    assert str(error) == "ASBP_CONFIG: the config file name must not be empty"


ENV_ERRORS = [
    ({"ASBP_PROT": "1"}, "ASBP_PROT: unknown setting (did you mean ASBP_PORT?)"),
    ({"ASBP_TLS__CERTFILE": "c"}, "ASBP_TLS__CERTFILE: unknown setting (did you mean ASBP_TLS_C"),
    ({"ASBP_CHANNELS_MAX_IN_FLIGHT": "1"}, "(did you mean ASBP_CHANNELS__MAX_IN_FLIGHT?)"),
    ({"ASBP_AGENTS__BILLING": "x"}, "[agents] table can only be set in the TOML file"),
    ({"ASBP_WHATEVER": "x"}, "ASBP_WHATEVER: unknown setting"),
    ({"ASBP_PORT": "eighty"}, "ASBP_PORT: expected an integer, got 'eighty'"),
    ({"ASBP_PORT": "8.0"}, "ASBP_PORT: expected an integer, got '8.0'"),
    ({"ASBP_PORT": "٨٠"}, "ASBP_PORT: expected an integer"),  # int() would take these digits
    ({"ASBP_PORT": "70000"}, "ASBP_PORT: must be between 0 and 65535, not 70000"),
    ({"ASBP_INSECURE_DEV_TUBES": "maybe"}, "expected one of 1/0, true/false, yes/no, on/off"),
    ({"ASBP_CHANNELS__LONG_POLL_TIMEOUT": "soon"}, "expected a number, got 'soon'"),
    ({"ASBP_CHANNELS__LONG_POLL_TIMEOUT": "nan"}, "must be a finite number, not 'nan'"),
    ({"ASBP_TUBES__OUTBOX_BYTES": "0"}, "ASBP_TUBES__OUTBOX_BYTES: must be positive, not 0"),
    ({"ASBP_LOG_FORMAT": "JSON"}, "ASBP_LOG_FORMAT: must be one of 'json' or 'text'"),
    ({"ASBP_HOST": ""}, "ASBP_HOST: must not be empty"),
    ({"ASBP_BROKER_ID": ""}, "ASBP_BROKER_ID: must not be empty"),
    ({"ASBP_BROKER_ID": "x" * 129}, "ASBP_BROKER_ID: must be 1 to 128 letters"),
    ({"ASBP_DATA_DIR": ""}, "ASBP_DATA_DIR: must not be empty"),
    ({"ASBP_REDIS_URL": "127.0.0.1:6379"}, "ASBP_REDIS_URL: must be a 'redis://', 'rediss://'"),
    ({"ASBP_AUTHENTICATE_COMMAND": "asbp.login"}, "ASBP_AUTHENTICATE_COMMAND: must not start"),
    ({"ASBP_AUTHENTICATE_COMMAND": "a=b"}, "ASBP_AUTHENTICATE_COMMAND: must be a Command-Name"),
    ({"ASBP_AUTHENTICATE_COMMAND": ""}, "ASBP_AUTHENTICATE_COMMAND: must not be empty"),
    (
        {"ASBP_FAILED_HANDSHAKES_PER_MINUTE": "-3"},
        "ASBP_FAILED_HANDSHAKES_PER_MINUTE: must be positive, not -3",
    ),
    (
        {"ASBP_FAILED_HANDSHAKES_PER_MINUTE": "ten"},
        "ASBP_FAILED_HANDSHAKES_PER_MINUTE: expected an integer, got 'ten'",
    ),
    (
        {"ASBP_SECURITY__AGENTS": "x"},
        "ASBP_SECURITY__AGENTS: unknown setting: the [security] table (access control) can only",
    ),
    ({"ASBP_ACL": "x"}, "ASBP_ACL: unknown setting: the [security] table (access control)"),
]


@pytest.mark.parametrize(("environ", "message"), ENV_ERRORS)
def test_environment_errors_name_the_variable(environ: dict[str, str], message: str) -> None:
    assert message in str(config_error(environ=environ))


def test_a_redis_password_is_masked_in_errors() -> None:
    error = config_error(environ={"ASBP_REDIS_URL": "http://user:hunter2@redis:6379"})
    assert "hunter2" not in str(error)
    assert "'http://user:***@redis:6379'" in str(error)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prot": 1}, "override 'prot': unknown setting (did you mean port?)"),
        ({"channels.long_poll": 1}, "did you mean channels.long_poll_timeout?"),
        ({"port": [1]}, "override 'port': expected an integer, got a list"),
        ({"port": True}, "override 'port': expected an integer, got true"),
        ({"insecure_dev_tubes": 1}, "override 'insecure_dev_tubes': expected one of 1/0"),
        ({"tubes.respondent_timeout": False}, "expected a number, got false"),
        ({"config": 3}, "override 'config': expected a path (a string), got 3"),
        ({"data_dir": 3}, "override 'data_dir': expected a path (a string), got 3"),
        ({"authenticate_command": "asbp.x"}, "override 'authenticate_command': must not start"),
        ({"failed_handshakes_per_minute": 0}, "override 'failed_handshakes_per_minute': must be"),
        ({"acl": object()}, "override 'acl': unknown setting: the [security] table"),
        ({"security": {}}, "override 'security': unknown setting: the [security] table"),
        ({"agents": {}}, "override 'agents': unknown setting: the [agents] table can only"),
    ],
)
def test_override_errors_name_the_override(overrides: dict[str, object], message: str) -> None:
    assert message in str(config_error(overrides))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "x"], "--port: expected an integer, got 'x'"),
        (["--port", "-5"], "--port: must be between 0 and 65535, not -5"),
        (
            ["--server", "daphne"],
            "--server: must be one of 'auto', 'hypercorn' or 'uvicorn', not 'daphne'",
        ),
        (["--broker-id", "a/b"], "--broker-id: must be 1 to 128 letters"),
        (["--log-level", "trace"], "--log-level: must be one of 'debug'"),
        (["--authenticate-command", "asbp.login"], "--authenticate-command: must not start"),
        (["--authenticate-command", "a,b"], "--authenticate-command: must be a Command-Name"),
        (["--failed-handshakes-per-minute", "0"], "--failed-handshakes-per-minute: must be"),
    ],
)
def test_flag_errors_name_the_flag(argv: list[str], message: str) -> None:
    assert message in str(config_error(parse_flags(*argv)))


def test_tls_needs_both_files(tls_files: TlsFiles) -> None:
    error = config_error(environ={"ASBP_TLS_CERTFILE": str(tls_files.cert)})
    assert str(error) == (
        "ASBP_TLS_CERTFILE: tls.certfile needs tls.keyfile as well "
        "(tls.keyfile in the file, ASBP_TLS_KEYFILE, --tls-key)"
    )
    error = config_error(parse_flags("--tls-key", str(tls_files.key)))
    assert str(error).startswith("--tls-key: tls.keyfile needs tls.certfile as well")


def test_tls_files_from_two_sources_make_a_pair(tmp_path: Path, tls_files: TlsFiles) -> None:
    file = write(tmp_path / "broker.toml", f'[tls]\ncertfile = "{tls_files.cert}"\n')
    config = load_config({"config": file}, environ={"ASBP_TLS_KEYFILE": str(tls_files.key)})
    assert config.tls == TlsConfig(tls_files.cert, tls_files.key)


def test_tls_files_must_exist(tmp_path: Path, tls_files: TlsFiles) -> None:
    missing = tmp_path / "missing.pem"
    error = config_error(parse_flags("--tls-cert", str(missing), "--tls-key", str(tls_files.key)))
    assert str(error) == f"--tls-cert: the TLS certificate file {str(missing)!r} does not exist"
    error = config_error(parse_flags("--tls-cert", str(tls_files.cert), "--tls-key", str(tmp_path)))
    assert str(error) == f"--tls-key: the TLS private key file {str(tmp_path)!r} does not exist"


def test_tls_files_must_load_as_a_pair(tmp_path: Path, tls_files: TlsFiles) -> None:
    not_a_key = write(tmp_path / "key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n")
    error = config_error(
        parse_flags("--tls-cert", str(tls_files.cert), "--tls-key", str(not_a_key))
    )
    assert str(error).startswith("--tls-cert, --tls-key: cannot load the TLS certificate and key")
    # The CA's certificate with the server's key: a key that does not match.
    error = config_error(
        parse_flags("--tls-cert", str(tls_files.ca), "--tls-key", str(tls_files.key))
    )
    assert "cannot load the TLS certificate and key" in str(error)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "broker.example.org", "128.0.0.1"])
def test_insecure_dev_tubes_refused_off_loopback(host: str) -> None:
    error = config_error(parse_flags("--insecure-dev-tubes"), {"ASBP_HOST": host})
    assert str(error).startswith(
        "--insecure-dev-tubes: insecure_dev_tubes is only allowed when host is a loopback "
        f"address (127.0.0.0/8, ::1 or localhost), and host is {host!r} (from ASBP_HOST): "
    )
    assert "clear text" in str(error)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST"])
def test_insecure_dev_tubes_allowed_on_loopback(host: str) -> None:
    config = load_config({"host": host, "insecure_dev_tubes": True}, environ={})
    assert config.insecure_dev_tubes is True


def test_config_error_carries_source_and_detail() -> None:
    error = config_error(environ={"ASBP_PORT": "x"})
    assert (error.source, error.detail) == ("ASBP_PORT", "expected an integer, got 'x'")
    assert (error.key, error.line) == ("port", None)
    # In the one error tree, still a ValueError, and printed without a fault code.
    assert isinstance(error, AsbpError) and isinstance(error, ValueError)
    assert str(error) == error.message == "ASBP_PORT: expected an integer, got 'x'"
    error = config_error({"channels.long_poll_timeout": 0})
    assert (error.key, error.source) == (
        "channels.long_poll_timeout",
        "override 'channels.long_poll_timeout'",
    )
    # A rule across settings names the setting that has to change.
    assert config_error(environ={"ASBP_TLS_KEYFILE": "key.pem"}).key == "tls.keyfile"


# --- the setting descriptions and the generated reference -----------------------------------


def test_every_field_is_a_setting_with_a_doc() -> None:
    tables = {
        "tls": TlsConfig,
        "limits": asbp.Limits,
        "channels": ChannelLimits,
        "tubes": TubeLimits,
        "messaging": MessagingLimits,
        "event_log": EventLogConfig,
        "metrics": MetricsConfig,
        "management": ManagementConfig,
    }
    expected = {field.name for field in dataclasses.fields(GatewayConfig)} - {
        "agents",
        "agents_base_dir",
        "acl",  # the [security] table: file only, built by gateway.acl
        "courses",  # the [courses] table: file only, checked by courses.settings
        *tables,
    }
    for table, cls in tables.items():
        expected |= {f"{table}.{field.name}" for field in dataclasses.fields(cls)}

    assert {s.key for s in settings()} == expected
    assert [s.key for s in settings() if not s.doc] == []
    assert len({s.env for s in settings()}) == len(settings())


def test_the_reference_is_up_to_date() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == config_reference(), (
        "docs/configuration.md is stale: python -m gateway.config > docs/configuration.md"
    )


def test_the_reference_lists_every_setting() -> None:
    reference = config_reference()
    for setting in settings():
        assert f"`{setting.env}`" in reference
        if setting.flag:
            assert f"`{setting.flag}`" in reference


def test_python_m_gateway_config_prints_the_reference() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=20 * T,
        check=True,
    )
    assert result.stdout == config_reference()


# --- writing the config back -----------------------------------------------------------------


def test_the_toml_form_reads_back_as_the_same_config(tmp_path: Path, tls_files: TlsFiles) -> None:
    public_pem = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    (tmp_path / "billing.pem").write_bytes(public_pem)
    source = write(
        tmp_path / "source.toml",
        '[agents."billing.eu"]\npublic_key = ["billing.pem"]\n',
    )
    config = load_config(
        {
            "config": source,
            "port": 0,
            "broker_id": "b-9",
            "data_dir": tmp_path / "data",
            "tls.certfile": tls_files.cert,
            "tls.keyfile": tls_files.key,
            "channels.long_poll_timeout": 0.25,
            "log_format": "text",
            "audience": 'say "hi"\\\x7f',
            "authenticate_command": "sessão.abrir",
            "failed_handshakes_per_minute": 7,
        },
        environ={},
    )

    copy = write(tmp_path / "copy.toml", config_to_toml(config))

    assert load_config({"config": copy}, environ={}) == config


def test_the_written_config_masks_the_redis_password() -> None:
    config = load_config({"redis_url": "redis://app:hunter2@redis:6379/0"}, environ={})

    text = config_to_toml(config)
    data = config_to_dict(config)

    assert "hunter2" not in text
    assert tomllib.loads(text)["redis_url"] == "redis://app:***@redis:6379/0"
    assert data["redis_url"] == "redis://app:***@redis:6379/0"
    assert "# broker_id is unset" in text
    assert "# authenticate_command is unset: Subjects are off" in text
    assert data["security"] is None
    # Relative paths are written absolute: the copy may be saved anywhere.
    assert data["data_dir"] == os.path.abspath(".asbp")
    assert orjson.loads(orjson.dumps(data))["tls"] is None


# --- gateway.broker_id ---------------------------------------------------------------------


def test_a_configured_broker_id_is_used_as_is(tmp_path: Path) -> None:
    config = GatewayConfig(broker_id="configured", data_dir=tmp_path / "data")
    assert broker_identity(config) == "configured"
    assert not (tmp_path / "data").exists()


def test_the_broker_id_is_created_once_and_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "state" / "data"
    first = broker_identity(GatewayConfig(data_dir=data_dir))

    assert len(first) == 32 and int(first, 16) >= 0  # a UUID in hex, as `i` values are
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert (data_dir / BROKER_ID_FILE).read_text() == first + "\n"
    assert os.listdir(data_dir) == [BROKER_ID_FILE]  # no temporary file left behind
    # A restart (a new config object, nothing cached) finds the same identity.
    assert broker_identity(GatewayConfig(data_dir=data_dir)) == first


def test_an_existing_data_dir_keeps_its_mode(tmp_path: Path) -> None:
    tmp_path.chmod(0o750)
    broker_identity(GatewayConfig(data_dir=tmp_path))
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750


def test_brokers_racing_on_one_data_dir_agree(tmp_path: Path) -> None:
    data_dir = tmp_path / "shared"
    barrier = threading.Barrier(8)
    results: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait(timeout=10 * T)
            results.append(broker_identity(GatewayConfig(data_dir=data_dir)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10 * T)

    assert not errors
    assert len(results) == 8 and len(set(results)) == 1
    assert (data_dir / BROKER_ID_FILE).read_text().strip() == results[0]
    assert os.listdir(data_dir) == [BROKER_ID_FILE]


@pytest.mark.parametrize("content", ["", "\n", "not a valid id!", "x" * 200])
def test_a_damaged_identity_file_is_an_error(tmp_path: Path, content: str) -> None:
    (tmp_path / BROKER_ID_FILE).write_text(content)
    with pytest.raises(ConfigError, match="does not hold a valid broker id") as info:
        broker_identity(GatewayConfig(data_dir=tmp_path))
    assert "delete the file" in str(info.value)


def test_a_data_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    blocker = write(tmp_path / "file", "")
    with pytest.raises(ConfigError, match="cannot keep the broker identity"):
        broker_identity(GatewayConfig(data_dir=blocker))
