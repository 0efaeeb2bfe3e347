"""The ``[courses]`` table: what it accepts, and a clear error for each mistake (pure)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agents import generate_agent_key
from courses.settings import CourseConfigError, CourseSettings
from gateway.config import ConfigError
from gateway.config.loading import load_config
from gateway.config.rendering import config_to_toml


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    private, public = generate_agent_key()
    (tmp_path / "bus.pem").write_text(private)
    (tmp_path / "peer.pub.pem").write_text(public)
    return tmp_path


def table(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "domain": "a.test",
        "signing_key": "bus.pem",
        "b.test": {
            "urls": ["wss://b.example/course"],
            "public_key": "peer.pub.pem",
            "names": ["chat.*"],
        },
    }
    base.update(changes)
    return base


def test_a_full_table(keys: Path) -> None:
    settings = CourseSettings.from_table(
        table(
            max_hops=2,
            max_age=60,
            ca="ca.pem",
            kid="k1",
            **{
                "c.test": {
                    "public_key": "peer.pub.pem",
                    "routes": ["z.test"],
                    "urls": "wss://c.example/course",
                    "exchanges": ["1.2.3"],
                    "addresses": ["bob\\*.*"],
                    "names": ["chat"],
                    "http2": "never",
                }
            },
        ),
        base_dir=keys,
    )
    assert (settings.domain, settings.max_hops, settings.max_age) == ("a.test", 2, 60.0)
    assert settings.ca == keys / "ca.pem" and settings.kid == "k1"
    b, c = settings.peers["b.test"], settings.peers["c.test"]
    assert settings.course_for("b.test") is b and settings.course_for("z.test") is c
    assert settings.course_for("y.test") is None
    assert (b.http2, c.http2) == ("auto", "never")
    assert b.permits("chat", None, ("bob*b.test",)) is None
    assert "Command-Name" in (b.permits("pay", None, ()) or "")
    assert c.permits("chat", "1.2.3", ("bob*c.test",)) is None
    assert "'x'" in (c.permits("chat", "9.9", ("bob*c.test",)) or "")
    assert "address" in (c.permits("chat", "1.2.3", ("eve*c.test",)) or "")
    bare = CourseSettings.from_table(
        table(**{"b.test": {"public_key": "peer.pub.pem"}}), base_dir=keys
    )
    assert bare.peers["b.test"].names == ()  # nothing crosses unless listed
    assert bare.peers["b.test"].http2 == "auto"  # HTTP/2 where the peer offers it
    assert bare.course_for("b.test") is None  # no URLs: it only dials us


@pytest.mark.parametrize(
    ("changes", "key", "text"),
    [
        ({"colour": "red"}, "colour", "unknown setting"),
        ({"domain": "not a domain"}, "domain", "domain name"),
        ({"signing_key": None}, "signing_key", "required"),
        ({"signing_key": "missing.pem"}, "signing_key", "cannot read"),
        ({"signing_key": "peer.pub.pem"}, "signing_key", "private key"),
        ({"ca": 3}, "ca", "file name"),
        ({"max_hops": 0}, "max_hops", "positive integer"),
        ({"max_hops": 1.5}, "max_hops", "positive integer"),
        ({"max_age": True}, "max_age", "positive number"),
        ({"a.test": {"public_key": "peer.pub.pem"}}, '"a.test"', "itself"),
        ({"b.test": {"public_key": "peer.pub.pem", "port": 1}}, '"b.test".port', "unknown"),
        ({"b.test": {"public_key": "peer.pub.pem", "urls": [1]}}, '"b.test".urls', "URLs"),
        ({"b.test": {"public_key": "peer.pub.pem", "urls": ["http://x"]}}, "urls", "wss://"),
        ({"b.test": {"public_key": "nope.pem"}}, '"b.test".public_key', "b.test"),
        ({"b.test": {"public_key": "peer.pub.pem", "names": ["("]}}, "names", "expression"),
        ({"b.test": {"public_key": "peer.pub.pem", "names": "x"}}, "names", "expressions"),
        ({"b.test": {"public_key": "peer.pub.pem", "exchanges": [1]}}, "exchanges", "'x'"),
        ({"b.test": {"public_key": "peer.pub.pem", "routes": "z"}}, "routes", "domains"),
        ({"b.test": {"public_key": "peer.pub.pem", "http2": "yes"}}, "http2", '"auto", "always"'),
        ({"b.test": {"public_key": "peer.pub.pem", "http2": True}}, '"b.test".http2', "never"),
        ({"lookup_max_commands": 0}, "lookup_max_commands", "positive integer"),
    ],
)
def test_each_mistake_names_its_key(
    keys: Path, changes: dict[str, Any], key: str, text: str
) -> None:
    with pytest.raises(CourseConfigError, match=re.escape(text)) as caught:
        CourseSettings.from_table(table(**changes), base_dir=keys)
    assert key in caught.value.key


def test_always_with_plain_urls_is_h2c(keys: Path) -> None:
    """``ws://`` URLs dial only under the development flag (courses.link); there,
    ``always`` is HTTP/2 with prior knowledge (courses.transport)."""
    peer = {"public_key": "peer.pub.pem", "http2": "always", "urls": ["ws://x/c"]}
    settings = CourseSettings.from_table(table(**{"b.test": peer}), base_dir=keys)
    assert settings.peers["b.test"].http2 == "always"
    assert settings.lookup_max_commands == 10_000
    changed = CourseSettings.from_table(table(lookup_max_commands=5), base_dir=keys)
    assert changed.lookup_max_commands == 5


def test_the_courses_table_loads_from_the_file_and_renders_back(keys: Path) -> None:
    (keys / "broker.toml").write_text(
        '[courses]\ndomain = "a.test"\nsigning_key = "bus.pem"\nmax_hops = 2\n'
        '[courses."b.test"]\nurls = ["wss://b.example/course"]\npublic_key = "peer.pub.pem"\n'
        'names = ["chat"]\n'
    )
    config = load_config({"config": str(keys / "broker.toml")}, environ={})
    assert config.courses["domain"] == "a.test"
    assert config.courses["b.test"]["names"] == ["chat"]
    rendered = config_to_toml(config)
    assert '[courses]\ndomain = "a.test"' in rendered and "max_hops = 2" in rendered
    assert '[courses."b.test"]' in rendered
    # What was rendered loads again to the same table.
    (keys / "again.toml").write_text(rendered)
    again = load_config({"config": str(keys / "again.toml")}, environ={})
    assert again.courses == config.courses


def test_the_courses_table_is_only_for_the_file() -> None:
    with pytest.raises(ConfigError, match=r"\[courses\] table can only be set in the TOML file"):
        load_config({}, environ={"ASBP_COURSES": "x"})


def test_permits_gives_the_same_answers_from_what_it_remembers(keys: Path) -> None:
    settings = CourseSettings.from_table(
        table(
            **{
                "c.test": {
                    "public_key": "peer.pub.pem",
                    "names": ["chat"],
                    "addresses": [".*", "x"],
                }
            }
        ),
        base_dir=keys,
    )
    b, c = settings.peers["b.test"], settings.peers["c.test"]
    for _ in range(2):  # the second time from what the first remembered
        assert b.permits("chat.x", None, ("bob*b.test",)) is None
        assert "Command-Name 'pay'" in (b.permits("pay", None, ("bob*b.test",)) or "")
        # Not the lone default expression: each address is matched.
        assert c.permits("chat", None, ("bob*c.test",)) is None
    # At most _MAX_NAMES_KNOWN names are remembered, however many are asked about.
    for n in range(2000):
        assert "may not cross" in (b.permits(f"pay{n}", None, ()) or "")
        assert len(b._names_known) <= 1024
    assert b.permits("chat", None, ()) is None
