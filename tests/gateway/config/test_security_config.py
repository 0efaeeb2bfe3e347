"""Security configuration: agents' ``serves`` allow-lists (gateway.auth.trust), the
``[security]`` table as gateway.config loads it, and how start-up reports mistakes."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import orjson
import pytest

from agents.credentials import generate_agent_key
from gateway.acl import DEFAULT_POLICY, Acl
from gateway.auth.credentials import AgentCredentials
from gateway.auth.trust import AgentTrust, ServeConfigError, ServePolicy, agent_trust
from gateway.config import ConfigError, config_to_dict, config_to_toml, load_config
from gateway.config.model import GatewayConfig
from gateway.ops.cli import main

AUTH = "auth.login"


# --------------------------------------------------------------------------
# gateway.auth.trust


def trust(
    agents: dict[str, dict[str, object]], authenticate_command: str | None = AUTH
) -> AgentTrust:
    return AgentTrust.from_agents_table(agents, authenticate_command)


def test_without_serves_any_name_but_the_authenticate_command() -> None:
    policy = trust({"billing": {"public_key": "billing.pem"}})
    assert policy.may_serve("billing", "billing.charge")
    assert policy.may_serve("billing", "anything-at-all")
    # The Authenticate-Command carries Subjects' credentials: never by default.
    assert not policy.may_serve("billing", AUTH)
    assert policy.authenticators == frozenset()


def test_without_an_authenticate_command_anything_goes_without_serves() -> None:
    policy = trust({"billing": {}}, authenticate_command=None)
    assert policy.may_serve("billing", AUTH)
    assert policy.authenticators == frozenset()


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("chat.send", True),
        ("chat.join", True),
        ("chat.", True),
        ("chatXsend", False),  # the dot is escaped
        ("xchat.send", False),  # the whole name must match...
        ("presence", True),
        ("presence.x", False),  # ...not a prefix of it
        ("presence\n", False),  # fullmatch: no "$ before a final newline" loophole
        ("billing.charge", False),
        (AUTH, True),
    ],
)
def test_serves_allows_only_whole_name_matches(name: str, allowed: bool) -> None:
    policy = trust({"chat": {"serves": [r"chat\..*", "presence", AUTH]}})
    assert policy.may_serve("chat", name) is allowed


@pytest.mark.parametrize(
    ("entry", "granted"),
    [
        ("auth.login", True),  # the name itself
        (r"auth\.login", True),  # the name with regex escapes
        (re.escape("auth.login"), True),
        (r"auth\..*", False),  # matches it, but does not name it
        (".*", False),
        ("auth.log.n", False),
        (r"auth\.(login)", False),
        (r"auth\.login|x", False),
    ],
)
def test_the_authenticate_command_must_be_named_explicitly(entry: str, granted: bool) -> None:
    policy = trust({"chat": {"serves": [entry]}})
    assert policy.may_serve("chat", AUTH) is granted
    assert policy.authenticators == (frozenset({"chat"}) if granted else frozenset())


def test_an_authenticate_command_with_regex_characters_is_named_escaped() -> None:
    name = "sign-in*"
    policy = trust({"a": {"serves": [re.escape(name)]}, "b": {"serves": [".*"]}}, name)
    assert policy.may_serve("a", name)
    assert not policy.may_serve("b", name)


def test_a_catch_all_serves_still_excludes_the_authenticate_command() -> None:
    policy = trust({"gateway": {"serves": [".*"]}})
    assert policy.may_serve("gateway", "anything")
    assert not policy.may_serve("gateway", AUTH)


def test_empty_serves_serves_nothing() -> None:
    policy = trust({"pusher": {"serves": []}})
    assert not policy.may_serve("pusher", "chat.send")
    assert not policy.may_serve("pusher", AUTH)


def test_one_string_is_a_list_of_one() -> None:
    assert trust({"chat": {"serves": r"chat\..*"}}).may_serve("chat", "chat.send")


def test_an_unconfigured_identity_may_serve_nothing() -> None:
    policy = trust({"billing": {}})
    assert not policy.may_serve("stranger", "billing.charge")
    assert not policy.may_serve("", "billing.charge")


def test_each_identity_has_its_own_policy() -> None:
    policy = trust({"auth": {"serves": [AUTH]}, "chat": {"serves": [r"chat\..*"]}, "any": {}})
    assert policy.authenticators == frozenset({"auth"})
    assert not policy.may_serve("auth", "chat.send")
    assert not policy.may_serve("chat", AUTH)
    assert policy.may_serve("any", "chat.send")
    assert set(policy.policies) == {"auth", "chat", "any"}
    assert policy.policies["any"] == ServePolicy()


def test_agent_trust_reads_the_gateway_config() -> None:
    config = GatewayConfig(
        agents={"auth": {"public_key": "a.pem", "serves": [AUTH]}, "other": {}},
        authenticate_command=AUTH,
    )
    policy = agent_trust(config)
    assert policy.authenticate_command == AUTH
    assert policy.may_serve("auth", AUTH)
    assert not policy.may_serve("other", AUTH)


@pytest.mark.parametrize(
    ("serves", "detail"),
    [
        (3, "must be a list of Command-Name patterns, not int"),
        ({"a": "b"}, "must be a list of Command-Name patterns, not dict"),
        (["ok", 7], "entry 1 must be a string, not int"),
        ([""], "'': a destination pattern must not be empty"),
        (["chat.["], "'chat.[': not a valid regular expression"),
        (["(a+)+"], "'(a+)+': nested quantifiers"),
        (["/a/.*/b/.*/c"], "'/a/.*/b/.*/c': after a repeat that can stop anywhere"),
        ([r"(a)\1"], "backreference"),
        (["(?=x)x"], "lookahead and lookbehind assertions"),
    ],
)
def test_bad_serves_names_the_agent(serves: object, detail: str) -> None:
    with pytest.raises(ServeConfigError) as info:
        trust({"fine": {"serves": ["x"]}, "chat": {"serves": serves}})
    assert info.value.identity == "chat"
    assert detail in info.value.detail
    assert str(info.value).startswith("agent 'chat': serves: ")


def test_credentials_accept_the_serves_key(tmp_path: Path) -> None:
    (tmp_path / "chat.pem").write_text(generate_agent_key()[1])
    registry = AgentCredentials.from_config(
        {"audience": "a", "agents": {"chat": {"public_key": "chat.pem", "serves": ["x"]}}},
        base_dir=tmp_path,
    )
    assert registry.identities == frozenset({"chat"})


# --------------------------------------------------------------------------
# gateway.config: [security], serves and authenticate_command from the file


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """A directory with public keys for the agents billing and chat."""
    for identity in ("billing", "chat"):
        (tmp_path / f"{identity}.pem").write_text(generate_agent_key()[1])
    return tmp_path


AGENTS = """
[agents.billing]
public_key = "billing.pem"

[agents.chat]
public_key = "chat.pem"
serves = ['chat\\..*', 'auth.login']
"""

SECURITY = """
[security.policies.default]
entries = [
  { action = "DENY", types = ["QUEUE"], destination = '/private/.*', privileges = ["READ"], condition = { always = true } },
]

[security.policies.vip]
inherits = "default"

[security.agents]
chat = "vip"

[security.roles]
admin = "vip"
"""  # noqa: E501 - one TOML inline table per line


def line_of(text: str, needle: str) -> int:
    """The 1-based line of ``text`` holding ``needle``."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def load(path: Path, text: str, **overrides: object) -> GatewayConfig:
    path.write_text(text, encoding="utf-8")
    return load_config({"config": str(path), **overrides}, environ={})


def error(path: Path, text: str, **overrides: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(path, text, **overrides)
    return info.value


def test_the_security_table_becomes_the_acl(conf: Path) -> None:
    file = conf / "broker.toml"
    text = 'authenticate_command = "auth.login"\n' + AGENTS + SECURITY
    config = load(file, text)

    acl = config.acl
    assert isinstance(acl, Acl) and acl.enabled
    assert acl.policy_names == ("default", "vip")
    assert dict(acl.agents) == {"chat": "vip"}
    assert dict(acl.roles) == {"admin": "vip"}
    assert acl.source == str(file)
    # Entries keep their lines, for Acl.describe in the logs.
    assert acl.stack(DEFAULT_POLICY)[0].line == line_of(text, "/private/")
    assert config.authenticate_command == AUTH
    assert agent_trust(config).authenticators == frozenset({"chat"})


def test_no_security_table_means_no_acl(conf: Path) -> None:
    assert load(conf / "broker.toml", AGENTS).acl is None
    assert load_config(environ={}).acl is None


def test_an_empty_security_table_turns_access_control_on(conf: Path) -> None:
    acl = load(conf / "broker.toml", "[security]\n").acl
    assert acl is not None and acl.enabled
    assert acl.policy_names == (DEFAULT_POLICY,)


def test_a_bad_policy_names_the_file_and_line(conf: Path) -> None:
    file = conf / "broker.toml"
    text = AGENTS + SECURITY.replace('types = ["QUEUE"]', 'types = ["QUEU"]')

    problem = error(file, text)

    line = line_of(text, "QUEU")
    assert problem.source == f"{file}:{line}"
    # The same facts as data, for a caller that wants more than the message.
    assert (problem.key, problem.line) == ("security", line)
    assert str(problem).startswith(
        f"{file}:{line}: policy 'default', entries[0]: types: unknown value 'QUEU'"
    )
    assert "did you mean 'QUEUE'?" in str(problem)
    assert isinstance(problem.__cause__, ValueError)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("security = 3\n", "broker.toml:1: [security] must be a table, not the number 3"),
        (
            "\n[security.policies.vip]\ninherits = 'gold'\n",
            "broker.toml:3: policy 'vip' inherits from unknown policy 'gold'",
        ),
        ("[security]\npolicy = {}\n", "broker.toml:2: [security]: unknown key 'policy'"),
        (
            "[security.policies.a]\nentries = [{ action = 'DENY', types = 'TOPIC', "
            "destination = '(x+)+', privileges = 'READ', condition = { always = true } }]\n",
            "broker.toml:2: policy 'a', entries[0]: destination '(x+)+': nested quantifiers",
        ),
        ("[security.agents]\nchat = 'nope'\n", "broker.toml:2: agent 'chat' is assigned"),
    ],
)
def test_security_errors_name_the_line(conf: Path, text: str, message: str) -> None:
    problem = error(conf / "broker.toml", text + AGENTS)
    assert f"{conf}/{message}" in str(problem)


def test_an_unknown_identity_in_security_agents_is_refused(conf: Path) -> None:
    file = conf / "broker.toml"
    text = AGENTS + SECURITY.replace('chat = "vip"', 'caht = "vip"')

    problem = error(file, text)

    line = text.splitlines().index('caht = "vip"') + 1
    assert str(problem) == (
        f"{file}:{line}: [security.agents] assigns a policy to 'caht', which is not a "
        "configured Application-Agent (the configured agents are 'billing', 'chat') "
        "(did you mean chat?)"
    )


def test_security_agents_without_any_agents_configured(conf: Path) -> None:
    problem = error(conf / "broker.toml", SECURITY)
    assert "'chat', which is not a configured Application-Agent" in str(problem)
    assert "(no [agents.<identity>] is configured)" in str(problem)


@pytest.mark.parametrize(
    ("serves", "message"),
    [
        ("['(a+)+']", "broker.toml:agents.chat.serves: '(a+)+': nested quantifiers"),
        ("['x[']", "broker.toml:agents.chat.serves: 'x[': not a valid regular expression"),
        ("3", "broker.toml:agents.chat.serves: must be a list of Command-Name patterns"),
        ("['a', 1]", "broker.toml:agents.chat.serves: entry 1 must be a string"),
        ("['']", "broker.toml:agents.chat.serves: '': a destination pattern must not be empty"),
    ],
)
def test_a_bad_serves_stops_start_up_naming_the_agent(
    conf: Path, serves: str, message: str
) -> None:
    text = AGENTS.replace("serves = ['chat\\..*', 'auth.login']", f"serves = {serves}")
    assert f"{conf}/{message}" in str(error(conf / "broker.toml", text))


def test_a_bad_serves_of_a_quoted_identity(conf: Path) -> None:
    text = '[agents."chat.eu"]\npublic_key = "chat.pem"\nserves = ["(a*)*"]\n'
    problem = error(conf / "broker.toml", text)
    assert problem.source == f'{conf / "broker.toml"}:agents."chat.eu".serves'


def test_serves_is_checked_with_the_authenticate_command_from_any_layer(conf: Path) -> None:
    file = conf / "broker.toml"
    file.write_text(AGENTS)
    config = load_config({"config": str(file)}, environ={"ASBP_AUTHENTICATE_COMMAND": AUTH})
    assert agent_trust(config).authenticators == frozenset({"chat"})
    config = load_config({"config": str(file), "authenticate_command": "sign-in"}, environ={})
    assert agent_trust(config).authenticators == frozenset()


def test_start_up_stops_with_the_file_and_line(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = conf / "broker.toml"
    text = AGENTS + SECURITY.replace('privileges = ["READ"]', 'privileges = ["REED"]')
    file.write_text(text)

    assert main(["broker", "--config", str(file)], environ={}) == 2

    err = capsys.readouterr().err
    line = line_of(text, "REED")
    assert err.startswith(f"asbp broker: {file}:{line}: policy 'default', entries[0]: privileges")
    assert "did you mean 'READ'?" in err


# --------------------------------------------------------------------------
# Writing the config back


def test_the_written_config_summarises_security_and_still_loads(conf: Path) -> None:
    source = conf / "broker.toml"
    text = AGENTS + SECURITY + '\n[security.policies."odd\\nname"]\n'
    config = load(source, text, data_dir=str(conf / "data"))

    text = config_to_toml(config)

    assert "# [security] (access control) from " in text
    assert "this file configures NO access control" in text
    assert '#   policies: default, vip, "odd\\nname"' in text
    assert '#   agents: chat = "vip"' in text
    assert '#   roles: admin = "vip"' in text
    assert "security" not in tomllib.loads(text)  # comments only
    copy = load(conf / "copy.toml", text)
    assert copy.acl is None
    assert copy == dataclasses.replace(config, acl=None)


def test_the_dict_form_carries_a_summary(conf: Path) -> None:
    config = load(conf / "broker.toml", AGENTS + SECURITY)
    data = orjson.loads(orjson.dumps(config_to_dict(config)))
    assert data["security"] == {
        "source": str(conf / "broker.toml"),
        "policies": ["default", "vip"],
        "agents": {"chat": "vip"},
        "roles": {"admin": "vip"},
    }
    assert data["agents"]["chat"]["serves"] == ["chat\\..*", "auth.login"]


def test_exports() -> None:
    import gateway.auth.trust

    assert all(hasattr(gateway.auth.trust, name) for name in gateway.auth.trust.__all__)
