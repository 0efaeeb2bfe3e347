"""Tests for gateway.acl: Sapo-Broker 3's access control, as docs/acl.md describes it.

Pure and table-driven: policies are built in code or loaded from TOML text, and
every check is a plain function call. Error-line tests mark the line the
loader must blame with ``# <-`` in the TOML itself, so the expectation sits
next to the text it describes.
"""

from __future__ import annotations

import ast
import ipaddress
import re
import timeit
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

import gateway.acl
import gateway.errors
from asbp.errors import AsbpError
from asbp.faults import FaultCode
from gateway.acl import (
    DEFAULT_POLICY,
    SYSTEM_ENTRY,
    AccessContext,
    AccessDenied,
    Acl,
    AclConfigError,
    AclEntry,
    Action,
    Address,
    Always,
    And,
    ChannelProperty,
    ChannelType,
    Condition,
    Decision,
    DestinationType,
    PatternError,
    Privilege,
    Role,
    SecurityPolicy,
    UnsafePatternError,
    acl_from_config,
    channel_properties,
    compile_destination,
    conditions,
    entries,
    errors,
    load_acl,
    loader,
    patterns,
    policy,
    toml_lines,
)
from gateway.acl.toml_lines import KeyPath, key_lines

ROOT: Final = Path(__file__).resolve().parents[3]
DOCS: Final = ROOT / "docs" / "acl.md"

TOPIC, QUEUE, VIRTUAL_QUEUE, COMMAND = (
    DestinationType.TOPIC,
    DestinationType.QUEUE,
    DestinationType.VIRTUAL_QUEUE,
    DestinationType.COMMAND,
)
READ, WRITE = Privilege.READ, Privilege.WRITE
PERMIT, DENY = Action.PERMIT, Action.DENY
TLS: Final = channel_properties(tls=True)
MTLS: Final = channel_properties(tls=True, verified_client_certificate=True)
ANYONE: Final = AccessContext()


def ctx(
    address: str | None = None,
    *roles: str,
    properties: frozenset[ChannelProperty] = frozenset(),
    agent: str | None = None,
) -> AccessContext:
    return AccessContext(
        address=address, roles=frozenset(roles), channel_properties=properties, agent_id=agent
    )


def entry(
    action: Action,
    types: DestinationType | tuple[DestinationType, ...],
    destination: str,
    privileges: Privilege | tuple[Privilege, ...],
    condition: Condition | None = None,
) -> AclEntry:
    return AclEntry.of(action, types, destination, privileges, condition)


# --------------------------------------------------------------------------
# Conditions


CONDITION_CASES: Final[list[tuple[str, Condition, AccessContext, bool]]] = [
    ("always", Always(), ANYONE, True),
    ("ipv4 inside", Address.parse("10.11.12.0/24"), ctx("10.11.12.7"), True),
    ("ipv4 network address", Address.parse("10.11.12.0/24"), ctx("10.11.12.0"), True),
    ("ipv4 broadcast", Address.parse("10.11.12.0/24"), ctx("10.11.12.255"), True),
    ("ipv4 outside", Address.parse("10.11.12.0/24"), ctx("10.11.13.7"), False),
    ("ipv4 host", Address.parse("192.0.2.1"), ctx("192.0.2.1"), True),
    ("ipv4 other host", Address.parse("192.0.2.1"), ctx("192.0.2.2"), False),
    ("ipv4 everyone", Address.parse("0.0.0.0/0"), ctx("203.0.113.9"), True),
    ("ipv6 inside", Address.parse("2001:db8::/32"), ctx("2001:db8:1::5"), True),
    ("ipv6 outside", Address.parse("2001:db8::/32"), ctx("2001:db9::5"), False),
    ("ipv6 loopback", Address.parse("::1"), ctx("::1"), True),
    ("ipv6 scoped peer", Address.parse("fe80::/10"), ctx("fe80::1%eth0"), True),
    (
        "ipv4-mapped peer, ipv4 network",
        Address.parse("10.11.12.0/24"),
        ctx("::ffff:10.11.12.7"),
        True,
    ),
    ("ipv4-mapped peer outside", Address.parse("10.11.12.0/24"), ctx("::ffff:10.11.13.7"), False),
    ("ipv4 peer, mapped network", Address.parse("::ffff:10.11.12.0/120"), ctx("10.11.12.7"), True),
    (
        "mapped peer, mapped network",
        Address.parse("::ffff:10.0.0.0/104"),
        ctx("::ffff:10.9.9.9"),
        True,
    ),
    ("ipv4 peer, ipv6 everyone", Address.parse("::/0"), ctx("10.11.12.7"), False),
    ("ipv6 peer, ipv4 everyone", Address.parse("0.0.0.0/0"), ctx("2001:db8::1"), False),
    ("same integer, other family", Address.parse("0.0.0.1"), ctx("::1"), False),
    ("unknown address", Address.parse("0.0.0.0/0"), ctx(None), False),
    ("empty address", Address.parse("0.0.0.0/0"), ctx(""), False),
    ("role held", Role("VIP_role"), ctx(None, "staff", "VIP_role"), True),
    ("role missing", Role("VIP_role"), ctx(None, "staff"), False),
    ("role is case-sensitive", Role("VIP_role"), ctx(None, "vip_role"), False),
    ("no roles", Role("VIP_role"), ANYONE, False),
    (
        "confidentiality over tls",
        ChannelType(frozenset({ChannelProperty.CONFIDENTIALITY})),
        ctx(properties=TLS),
        True,
    ),
    (
        "confidentiality in clear",
        ChannelType(frozenset({ChannelProperty.CONFIDENTIALITY})),
        ANYONE,
        False,
    ),
    (
        "authenticity needs a client certificate",
        ChannelType(frozenset({ChannelProperty.AUTHENTICITY})),
        ctx(properties=TLS),
        False,
    ),
    (
        "authenticity with a client certificate",
        ChannelType(frozenset({ChannelProperty.AUTHENTICITY})),
        ctx(properties=MTLS),
        True,
    ),
    (
        "every listed property",
        ChannelType(frozenset({ChannelProperty.CONFIDENTIALITY, ChannelProperty.AUTHENTICITY})),
        ctx(properties=TLS),
        False,
    ),
    ("and: all hold", And((Role("a"), Role("b"))), ctx(None, "a", "b"), True),
    ("and: one fails", And((Role("a"), Role("b"))), ctx(None, "a"), False),
    (
        "and: role and confidentiality",
        And.of([Role("VIP_role"), ChannelType(frozenset({ChannelProperty.CONFIDENTIALITY}))]),
        ctx("10.0.0.1", "VIP_role", properties=TLS),
        True,
    ),
    (
        "and: nested",
        And((Address.parse("10.0.0.0/8"), And((Role("a"), Always())))),
        ctx("10.1.1.1", "a"),
        True,
    ),
    (
        "and: nested fails inside",
        And((Address.parse("10.0.0.0/8"), And((Role("a"), Role("b"))))),
        ctx("10.1.1.1", "a"),
        False,
    ),
]


@pytest.mark.parametrize(
    ("condition", "context", "expected"),
    [case[1:] for case in CONDITION_CASES],
    ids=[case[0] for case in CONDITION_CASES],
)
def test_condition(condition: Condition, context: AccessContext, expected: bool) -> None:
    assert condition.matches(context) is expected


@pytest.mark.parametrize(
    ("tls", "certificate", "expected"),
    [
        (False, False, set()),
        (True, False, {"CONFIDENTIALITY", "INTEGRITY"}),
        (True, True, {"CONFIDENTIALITY", "INTEGRITY", "AUTHENTICITY"}),
    ],
)
def test_channel_properties(tls: bool, certificate: bool, expected: set[str]) -> None:
    properties = channel_properties(tls=tls, verified_client_certificate=certificate)
    assert {item.name for item in properties} == expected


def test_channel_properties_certificate_needs_tls() -> None:
    with pytest.raises(ValueError, match="without TLS"):
        channel_properties(tls=False, verified_client_certificate=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.11.12.5/24", "host bits set"),
        ("10.11.12.0/33", "not an IP network"),
        ("example.com", "not an IP network"),
        ("", "not an IP network"),
    ],
)
def test_address_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Address.parse(text)


def test_address_keeps_the_network_as_written() -> None:
    written = ipaddress.ip_network("::ffff:10.11.12.0/120")
    assert Address(written).network == written
    assert Address(written) == Address.parse("::ffff:10.11.12.0/120")


def test_access_context_validates() -> None:
    with pytest.raises(ValueError, match="without port"):
        AccessContext(address="10.0.0.1:8080")
    with pytest.raises(ValueError, match="without port"):
        AccessContext(address="[::1]")
    with pytest.raises(TypeError, match="roles"):
        AccessContext(roles={"a"})  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(TypeError, match="roles"):
        AccessContext(roles=frozenset({1}))  # type: ignore[arg-type]  # likewise
    with pytest.raises(TypeError, match="channel_properties"):
        AccessContext(channel_properties=frozenset({"CONFIDENTIALITY"}))  # type: ignore[arg-type]  # likewise
    context = AccessContext(address="10.0.0.1", agent_id="a", subject_id="s", channel_id="c")
    assert context == AccessContext(
        address="10.0.0.1", agent_id="a", subject_id="s", channel_id="c"
    )
    assert "_peer" not in repr(context)


def test_conditions_validate() -> None:
    with pytest.raises(ValueError, match="at least one"):
        And(())
    with pytest.raises(TypeError, match="not a condition"):
        And(("role",))  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(ValueError, match="non-empty"):
        Role("")
    with pytest.raises(ValueError, match="non-empty"):
        ChannelType(frozenset())
    with pytest.raises(TypeError, match=r"Address\.parse"):
        Address("10.0.0.0/8")  # type: ignore[arg-type]  # likewise


# --------------------------------------------------------------------------
# Destination patterns and the runaway-backtracking checker


ACCEPTED_PATTERNS: Final = [
    "/topic/foo",
    "/private/.*",
    "/system/.*",
    ".*",
    ".+",
    "/tenant/[^/]+/orders/.*",
    "/tenant/[^/]+/orders/[^/]*",
    "/a/.*/b/.*",
    "/a/.*/b",
    ".*\\.json",
    "(foo|bar)/.*",
    "/(topic|queue)/[a-z0-9_-]+",
    "(a|b)+",  # re turns it into [ab]+
    "(?:[a-z]{2})+",  # a fixed count inside a repeat has one way to match
    "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
    "chat\\..*",
    "admin\\.[a-z_]+",
    "[a-z]+\\.[a-z]+",
    "^/anchored/.*$",
    "(?:ab)*c",
    "(/x)?(/y)?.*",
    "(?i)/a/[^/]+/b/[^/]+",  # "/" has no other case
    "(?i:x)[^a]*A",  # one repeat that can stop anywhere is allowed
    "/a/[^/]*+/b/.*",  # possessive
    "/a/(?>[^/]*)/.*",  # atomic group
    "(?P<name>/named)/.*",
    "/x{0}y",
    "(?:.*)?",
    "[^\\d]*1.*",
    "[\\w]*/.*",
    "[\\s]*/x",
    "[^\\S]*/x",
    "[^\\W]*/x",
    "[^\\D]*/x",
    "a*/b+/.*",
    "[ab]*/.*",
]


@pytest.mark.parametrize("pattern", ACCEPTED_PATTERNS)
def test_pattern_accepted(pattern: str) -> None:
    compiled = compile_destination(pattern)
    assert compiled.pattern == pattern
    assert compiled.flags & re.DOTALL


REFUSED_PATTERNS: Final = [
    ("/(a+)+", "nested quantifiers"),
    ("(a*)*", "nested quantifiers"),
    ("(?:a?b)*", "nested quantifiers"),
    ("(?:(?:a|b)?c){2}", "nested quantifiers"),
    ("(foo|f)+", "alternation inside a repeat"),
    ("(?:x(?:foo|f)){3}", "alternation inside a repeat"),
    ("(/x)\\1", "backreferences"),
    ("(?P<n>/x)(?P=n)", "backreferences"),
    ("(/x)?(?(1)a|b)", "conditional groups"),
    ("/x(?=y).*", "lookahead and lookbehind"),
    ("/x(?!y).*", "lookahead and lookbehind"),
    ("(?<=/)x", "lookahead and lookbehind"),
    ("(?<!/)x", "lookahead and lookbehind"),
    (".*.*x", "after a repeat that can stop anywhere"),
    ("/a/.*/b/.*/c", "after a repeat that can stop anywhere"),
    ("/a/.*/b/.*x", "after a repeat that can stop anywhere"),
    ("(.*)(.*)x", "after a repeat that can stop anywhere"),
    (".*[^/]*/", "after a repeat that can stop anywhere"),
    (".{0,100}.*x", "after a repeat that can stop anywhere"),
    ("/a/.*/b/[^x]*", "after a repeat that can stop anywhere"),
    (".*a[^/]*/c", "after a repeat that can stop anywhere"),
    ("(?:ab)*c[^/]*", "after a repeat that can stop anywhere"),
    ("(?i)/a/[^a]+A[^/]+x", "after a repeat that can stop anywhere"),
    ("[^/]*(?i:/)[^b]*B[^/]*x", "after a repeat that can stop anywhere"),
    ("(?-s:.)*x.*", "after a repeat that can stop anywhere"),
    ("/a/.*/b/.{0,5}", "after a repeat that can stop anywhere"),
    ("(?:/.*)?/[^/]*", "after a repeat that can stop anywhere"),
    ("[a/]*/x*/", "after a repeat that can stop anywhere"),
    ("a*a[^/]*/", "after a repeat that can stop anywhere"),
]


@pytest.mark.parametrize(("pattern", "message"), REFUSED_PATTERNS)
def test_pattern_refused(pattern: str, message: str) -> None:
    with pytest.raises(UnsafePatternError, match=re.escape(message)):
        compile_destination(pattern)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "must not be empty"),
        ("/a/(b", "not a valid regular expression: missing \\), unterminated subpattern"),
        ("[z-a]", "not a valid regular expression: bad character range"),
        ("*", "not a valid regular expression: nothing to repeat"),
    ],
)
def test_pattern_invalid(pattern: str, message: str) -> None:
    with pytest.raises(PatternError, match=message) as caught:
        compile_destination(pattern)
    assert not isinstance(caught.value, UnsafePatternError)


# Adversarial names for accepted patterns: long, and failing as late as possible.
N: Final = 8192
WORST_CASES: Final = [
    ("/a/.*/b/.*", "/a/" + "/c/" * (N // 3) + "x"),
    ("/a/.*/b", "/a/" + "/b/" * (N // 3) + "x"),
    ("(?:ab)*c", "ab" * (N // 2)),
    ("[^/]*/[^/]*/[^/]*/x", "a/" * (N // 2)),
    ("/t/[^/]+/o/[^/]*/.*", "/t/" + "a" * N),
    (".*/x/y/z/w", "/x/y/z/" * (N // 7)),
    ("[a-z]+\\.[a-z]+", "a" * N + "!"),
]


@pytest.mark.parametrize(("pattern", "name"), WORST_CASES)
def test_accepted_patterns_stay_fast_on_adversarial_names(pattern: str, name: str) -> None:
    compiled = compile_destination(pattern)
    # Measured at under 0.3 ms; refused shapes take 50 ms to seconds on such names.
    best = min(timeit.repeat(lambda: compiled.fullmatch(name), number=1, repeat=3))
    assert best < 0.02


def test_dotall_closes_the_newline_gap() -> None:
    acl = Acl([SecurityPolicy("default", (entry(DENY, TOPIC, "/private/.*", READ),))])
    assert not acl.check(ANYONE, TOPIC, "/private/\nx", READ).allowed
    assert not acl.check(ANYONE, TOPIC, "/private/x\n", READ).allowed


def test_entry_refuses_unchecked_patterns() -> None:
    with pytest.raises(ValueError, match="compile_destination"):
        AclEntry(DENY, frozenset({TOPIC}), re.compile("/x/.*"), frozenset({READ}), Always())
    with pytest.raises(UnsafePatternError):
        AclEntry(
            DENY, frozenset({TOPIC}), re.compile("(a+)+", re.DOTALL), frozenset({READ}), Always()
        )
    with pytest.raises(ValueError, match="destination type"):
        AclEntry(DENY, frozenset(), compile_destination("/x"), frozenset({READ}), Always())
    with pytest.raises(ValueError, match="privilege"):
        AclEntry(DENY, frozenset({TOPIC}), compile_destination("/x"), frozenset(), Always())
    with pytest.raises(ValueError, match="needs a name"):
        SecurityPolicy("")


def test_entry_of_and_applies() -> None:
    built = AclEntry.of(DENY, (TOPIC, QUEUE), "/x/.*", (READ, WRITE), Role("r"), line=7)
    assert built == AclEntry(
        DENY,
        frozenset({TOPIC, QUEUE}),
        compile_destination("/x/.*"),
        frozenset({READ, WRITE}),
        Role("r"),
    )
    assert built.line == 7
    assert built.applies(ctx(None, "r"), QUEUE, "/x/1", WRITE)
    assert not built.applies(ctx(None, "r"), VIRTUAL_QUEUE, "/x/1", WRITE)
    assert not built.applies(ctx(None), QUEUE, "/x/1", WRITE)
    assert not built.applies(ctx(None, "r"), QUEUE, "/y/1", WRITE)
    assert AclEntry.of(PERMIT, COMMAND, "a", WRITE).condition == Always()


# --------------------------------------------------------------------------
# Evaluation


def only(policy_entries: list[AclEntry], **options: Any) -> Acl:
    """An Acl with one policy, "default", holding ``policy_entries``."""
    return Acl([SecurityPolicy(DEFAULT_POLICY, tuple(policy_entries), **options)])


PERMIT_A_THEN_DENY = only(
    [entry(PERMIT, QUEUE, "/q", WRITE, Role("a")), entry(DENY, QUEUE, "/q", WRITE)]
)
DENY_THEN_PERMIT = only([entry(DENY, QUEUE, "/q", WRITE), entry(PERMIT, QUEUE, "/q", WRITE)])
MULTI = only([entry(DENY, (TOPIC, QUEUE), "/m/.*", (READ, WRITE))])
INHERITED = Acl(
    [
        SecurityPolicy(
            "default",
            (entry(DENY, TOPIC, "/t/.*", WRITE), entry(PERMIT, TOPIC, "/t/open", WRITE)),
        ),
        SecurityPolicy("staff", (entry(PERMIT, TOPIC, "/t/staff", WRITE),), parent="default"),
        SecurityPolicy("vip", (entry(PERMIT, TOPIC, "/t/vip", WRITE),), parent="staff"),
        SecurityPolicy(
            "loner",
            (
                entry(PERMIT, TOPIC, "/t/.*", WRITE),
                entry(PERMIT, TOPIC, "/system/bridge/.*", WRITE),
            ),
        ),
    ],
    agents={"agent-vip": "vip", "agent-loner": "loner"},
)
DEFAULTS = Acl(
    [
        SecurityPolicy(DEFAULT_POLICY, default_action=DENY),
        SecurityPolicy("child", (entry(PERMIT, TOPIC, "/ok", READ),), parent=DEFAULT_POLICY),
        SecurityPolicy("lenient", parent="child", default_action=PERMIT),
    ],
    agents={"child": "child", "lenient": "lenient"},
)
EMPTY = Acl()
ALLOW_ALL = Acl.allow_all()

ROLE_A = ctx(None, "a")
VIP = ctx(agent="agent-vip")
LONER = ctx(agent="agent-loner")
STRANGER = ctx(agent="agent-x")
CHILD = ctx(agent="child")
LENIENT = ctx(agent="lenient")


@dataclass(frozen=True)
class Case:
    """One check: ``request`` is "TYPE destination PRIVILEGE", ``expected`` is
    "permit|deny <policy, or none> <entry index, or ->"."""

    name: str
    acl: Acl
    context: AccessContext
    request: str
    expected: str

    def parsed(self) -> tuple[tuple[DestinationType, str, Privilege], Decision]:
        kind, destination, privilege = self.request.split(" ")
        action, policy_name, index = self.expected.split(" ")
        decision = Decision(
            allowed=action == "permit",
            policy=None if policy_name == "none" else policy_name,
            entry_index=None if index == "-" else int(index),
        )
        return (DestinationType[kind], destination, Privilege[privilege]), decision


EVALUATION_CASES: Final = [
    # First match wins, in declaration order; type and privilege must match too.
    Case(
        "permit first, role held", PERMIT_A_THEN_DENY, ROLE_A, "QUEUE /q WRITE", "permit default 0"
    ),
    Case("permit first, no role", PERMIT_A_THEN_DENY, ANYONE, "QUEUE /q WRITE", "deny default 1"),
    Case("deny first", DENY_THEN_PERMIT, ANYONE, "QUEUE /q WRITE", "deny default 0"),
    Case("other privilege", DENY_THEN_PERMIT, ANYONE, "QUEUE /q READ", "permit default -"),
    Case("other type", DENY_THEN_PERMIT, ANYONE, "TOPIC /q WRITE", "permit default -"),
    Case("whole name only", DENY_THEN_PERMIT, ANYONE, "QUEUE /q/x WRITE", "permit default -"),
    Case("no prefix match", DENY_THEN_PERMIT, ANYONE, "QUEUE x/q WRITE", "permit default -"),
    # Several types and privileges in one entry.
    Case("multi: topic read", MULTI, ANYONE, "TOPIC /m/1 READ", "deny default 0"),
    Case("multi: topic write", MULTI, ANYONE, "TOPIC /m/1 WRITE", "deny default 0"),
    Case("multi: queue read", MULTI, ANYONE, "QUEUE /m/1 READ", "deny default 0"),
    Case("multi: queue write", MULTI, ANYONE, "QUEUE /m/1 WRITE", "deny default 0"),
    Case("multi: not virtual queue", MULTI, ANYONE, "VIRTUAL_QUEUE /m/1 READ", "permit default -"),
    Case("multi: not command", MULTI, ANYONE, "COMMAND /m/1 WRITE", "permit default -"),
    # Inheritance: the most specific policy first, then each ancestor in turn.
    Case("vip: own entry", INHERITED, VIP, "TOPIC /t/vip WRITE", "permit vip 0"),
    Case("vip: from staff", INHERITED, VIP, "TOPIC /t/staff WRITE", "permit vip 1"),
    Case("vip: from default", INHERITED, VIP, "TOPIC /t/x WRITE", "deny vip 2"),
    Case("vip: default's order kept", INHERITED, VIP, "TOPIC /t/open WRITE", "deny vip 2"),
    Case("default alone", INHERITED, ANYONE, "TOPIC /t/vip WRITE", "deny default 0"),
    Case("unassigned agent", INHERITED, STRANGER, "TOPIC /t/vip WRITE", "deny default 0"),
    Case("no parent: no default entries", INHERITED, LONER, "TOPIC /t/x WRITE", "permit loner 0"),
    # The built-in /system/ entry, under every stack.
    Case("system: topic write", EMPTY, ANYONE, "TOPIC /system/stats/x WRITE", "deny default 0"),
    Case("system: queue write", EMPTY, ANYONE, "QUEUE /system/x WRITE", "deny default 0"),
    Case("system: vqueue write", EMPTY, ANYONE, "VIRTUAL_QUEUE /system/x WRITE", "deny default 0"),
    Case("system: read", EMPTY, ANYONE, "TOPIC /system/x READ", "permit default -"),
    Case("system: command", EMPTY, ANYONE, "COMMAND /system/x WRITE", "permit default -"),
    Case("system: no slash", EMPTY, ANYONE, "TOPIC /system WRITE", "permit default -"),
    Case("system: under vip", INHERITED, VIP, "QUEUE /system/x WRITE", "deny vip 4"),
    Case("system: lone policy", INHERITED, LONER, "QUEUE /system/x WRITE", "deny loner 2"),
    Case(
        "system: PERMIT above wins",
        INHERITED,
        LONER,
        "TOPIC /system/bridge/x WRITE",
        "permit loner 1",
    ),
    # No entry applies: the default action, inherited unless overridden.
    Case("default action deny", DEFAULTS, ANYONE, "TOPIC /x READ", "deny default -"),
    Case("inherited deny", DEFAULTS, CHILD, "TOPIC /x READ", "deny child -"),
    Case("inherited deny, entry permits", DEFAULTS, CHILD, "TOPIC /ok READ", "permit child 0"),
    Case("overridden to permit", DEFAULTS, LENIENT, "TOPIC /x READ", "permit lenient -"),
    Case("nothing configured: permit", EMPTY, ANYONE, "QUEUE /any WRITE", "permit default -"),
    # No security policies at all: everything, /system/ included.
    Case("allow all", ALLOW_ALL, ANYONE, "QUEUE /system/x WRITE", "permit none -"),
]


@pytest.mark.parametrize("case", EVALUATION_CASES, ids=[case.name for case in EVALUATION_CASES])
def test_evaluation(case: Case) -> None:
    request, expected = case.parsed()
    assert case.acl.check(case.context, *request) == expected
    assert case.acl.policy_for(case.context) == expected.policy
    if expected.entry_index is not None:
        decided_by = case.acl.stack(expected.policy or "")[expected.entry_index]
        assert decided_by.applies(case.context, *request)
        assert decided_by.action is (PERMIT if expected.allowed else DENY)


def test_stack_is_flattened_most_specific_first() -> None:
    stack = INHERITED.stack("vip")
    assert [e.destination.pattern for e in stack] == [
        "/t/vip",
        "/t/staff",
        "/t/.*",
        "/t/open",
        "/system/.*",
    ]
    assert stack[-1] is SYSTEM_ENTRY
    assert INHERITED.stack("loner")[-1] is SYSTEM_ENTRY
    assert INHERITED.policy_names == ("default", "staff", "vip", "loner")
    with pytest.raises(KeyError):
        INHERITED.stack("nobody")


def test_default_policy_is_implied() -> None:
    acl = Acl([SecurityPolicy("vip", parent=DEFAULT_POLICY)])
    assert acl.policy_names == ("vip", "default")
    assert acl.stack(DEFAULT_POLICY) == (SYSTEM_ENTRY,)
    assert acl.default_action(DEFAULT_POLICY) is PERMIT
    assert EMPTY.enabled
    assert not Acl.allow_all().enabled
    assert Acl.allow_all().policy_for(ANYONE) is None


def test_default_actions() -> None:
    assert DEFAULTS.default_action("default") is DENY
    assert DEFAULTS.default_action("child") is DENY
    assert DEFAULTS.default_action("lenient") is PERMIT


ROLES_ACL = Acl(
    [SecurityPolicy("vip"), SecurityPolicy("staff"), SecurityPolicy("billing")],
    agents={"billing": "billing"},
    roles={"vip": "vip", "staff": "staff"},
)


def test_assignments_are_visible() -> None:
    assert dict(ROLES_ACL.agents) == {"billing": "billing"}
    assert list(ROLES_ACL.roles.items()) == [("vip", "vip"), ("staff", "staff")]
    assert dict(EMPTY.agents) == {} and dict(EMPTY.roles) == {}


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        (ANYONE, "default"),
        (ctx(None, "guest"), "default"),
        (ctx(None, "staff"), "staff"),
        (ctx(None, "vip"), "vip"),
        # The first role in the file's order wins, whatever the Subject's set holds.
        (ctx(None, "staff", "vip"), "vip"),
        (ctx(None, "guest", "staff"), "staff"),
        # An agent's own assignment wins over roles.
        (ctx(None, "vip", agent="billing"), "billing"),
        (ctx(None, "vip", agent="unlisted"), "vip"),
        (ctx(agent="unlisted"), "default"),
    ],
)
def test_policy_selection(context: AccessContext, expected: str) -> None:
    assert ROLES_ACL.policy_for(context) == expected


@pytest.mark.parametrize(
    ("build", "message", "key"),
    [
        (
            lambda: Acl([SecurityPolicy("a"), SecurityPolicy("a")]),
            "policy 'a' is declared twice",
            ("policies", "a"),
        ),
        (
            lambda: Acl([SecurityPolicy("a", parent="zzz")]),
            "policy 'a' inherits from unknown policy 'zzz'",
            ("policies", "a", "inherits"),
        ),
        (
            lambda: Acl([SecurityPolicy("a", parent="a")]),
            "policy 'a' is part of an inheritance cycle: a -> a",
            ("policies", "a", "inherits"),
        ),
        (
            lambda: Acl(
                [
                    SecurityPolicy("x", parent="b"),
                    SecurityPolicy("a", parent="b"),
                    SecurityPolicy("b", parent="a"),
                ]
            ),
            "policy 'a' is part of an inheritance cycle: b -> a -> b",
            ("policies", "a", "inherits"),
        ),
        (
            lambda: Acl([SecurityPolicy("default", parent="default")]),
            "inheritance cycle: default -> default",
            ("policies", "default", "inherits"),
        ),
        (
            lambda: Acl(agents={"billing": "vip"}),
            "agent 'billing' is assigned unknown policy 'vip' (known: 'default')",
            ("agents", "billing"),
        ),
        (
            lambda: Acl(roles={"admin": "vip"}),
            "role 'admin' is assigned unknown policy 'vip'",
            ("roles", "admin"),
        ),
        (
            lambda: Acl(agents={"": "default"}),
            "an empty agent name",
            ("agents", ""),
        ),
    ],
)
def test_acl_refuses(build: Any, message: str, key: KeyPath) -> None:
    with pytest.raises(AclConfigError, match=re.escape(message)) as caught:
        build()
    assert caught.value.key == key
    assert caught.value.line is None
    assert str(caught.value) == caught.value.detail


COMMANDS = Acl(
    [
        SecurityPolicy(
            DEFAULT_POLICY,
            (
                entry(PERMIT, COMMAND, "asbp\\..*", WRITE),
                entry(PERMIT, COMMAND, "chat\\..*", WRITE, Role("member")),
                entry(PERMIT, COMMAND, "chat\\..*", READ, Address.parse("10.0.0.0/8")),
            ),
            default_action=DENY,
        )
    ]
)


@pytest.mark.parametrize(
    ("context", "name", "privilege", "allowed"),
    [
        (ANYONE, "asbp.ping", WRITE, True),
        (ANYONE, "chat.send", WRITE, False),
        (ctx(None, "member"), "chat.send", WRITE, True),
        (ctx(None, "member"), "chatXsend", WRITE, False),
        (ctx(None, "member"), "billing.charge", WRITE, False),
        (ctx("10.1.2.3"), "chat.send", READ, True),
        (ctx("192.0.2.1"), "chat.send", READ, False),
    ],
)
def test_command_names(
    context: AccessContext, name: str, privilege: Privilege, allowed: bool
) -> None:
    assert COMMANDS.check(context, COMMAND, name, privilege).allowed is allowed


def test_require() -> None:
    allowed = PERMIT_A_THEN_DENY.require(ctx(None, "a"), QUEUE, "/q", WRITE)
    assert allowed == Decision(True, "default", 0)
    with pytest.raises(AccessDenied) as caught:
        PERMIT_A_THEN_DENY.require(ANYONE, QUEUE, "/q", WRITE)
    denied = caught.value
    assert isinstance(denied, AsbpError)
    assert denied.code is FaultCode.ACCESS_DENIED
    assert int(denied.code) == 3201
    assert denied.message == "WRITE access to QUEUE '/q' is denied"
    assert str(denied) == "3201: WRITE access to QUEUE '/q' is denied"
    assert "default" not in denied.message  # no policy internals for the peer
    assert (denied.destination_type, denied.destination, denied.privilege) == (QUEUE, "/q", WRITE)
    assert denied.decision == Decision(False, "default", 1)


def test_access_denied_shortens_long_destinations() -> None:
    name = "/private/" + "x" * 1000
    with pytest.raises(AccessDenied) as caught:
        only([entry(DENY, TOPIC, "/private/.*", READ)]).require(ANYONE, TOPIC, name, READ)
    assert len(caught.value.message) < 260
    assert caught.value.destination == name


def test_describe() -> None:
    acl = load_acl(
        '[security.policies.default]\nentries = [\n  { action = "DENY", types = ["TOPIC"], '
        "destination = '/x', privileges = [\"READ\"], condition = { always = true } },\n]\n"
        '[security.policies.vip]\ninherits = "default"\n[security.agents]\nbilling = "vip"\n',
        name="broker.toml",
    )
    vip = ctx(agent="billing")
    assert acl.describe(acl.check(vip, TOPIC, "/x", READ)) == (
        "denied by policy 'vip', stack entry 0 (an entry of policy 'default' at "
        "broker.toml:3): DENY '/x'"
    )
    assert acl.describe(acl.check(vip, TOPIC, "/system/x", WRITE)) == (
        "denied by policy 'vip', stack entry 1 (the built-in /system/ entry): DENY '/system/.*'"
    )
    assert acl.describe(acl.check(vip, TOPIC, "/y", READ)) == (
        "allowed by policy 'vip': no entry applies (default action)"
    )
    assert PERMIT_A_THEN_DENY.describe(Decision(True, "default", 0)) == (
        "allowed by policy 'default', stack entry 0 (an entry of policy 'default'): PERMIT '/q'"
    )
    allow_all = Acl.allow_all()
    assert allow_all.describe(allow_all.check(ANYONE, TOPIC, "/x", READ)) == (
        "allowed: no security policy is configured"
    )


# --------------------------------------------------------------------------
# Cost: linear in the entries that could apply, nothing else


@dataclass(frozen=True, slots=True)
class CountingRole(Role):
    """A Role that counts how often it is asked."""

    calls: list[None] = field(default_factory=list, compare=False)

    def matches(self, context: AccessContext) -> bool:
        self.calls.append(None)
        return Role.matches(self, context)


def counted_acl(size: int, *, bystanders: int) -> tuple[Acl, list[CountingRole]]:
    """A "target" policy of ``size`` QUEUE WRITE entries that all match the name but
    none of whose roles the caller holds, plus many other policies and agents."""
    roles = [CountingRole(f"role-{index}") for index in range(size)]
    own = [entry(DENY, QUEUE, ".*", WRITE, role) for role in roles]
    # Entries for other types and privileges: never visited by a QUEUE WRITE check.
    own += [entry(DENY, (TOPIC, VIRTUAL_QUEUE, COMMAND), ".*", (READ, WRITE), r) for r in roles]
    own += [entry(DENY, QUEUE, ".*", READ, role) for role in roles]
    others = [SecurityPolicy(f"other-{index}", tuple(own[:3])) for index in range(bystanders)]
    acl = Acl(
        [SecurityPolicy("target", tuple(own)), *others],
        agents={f"agent-{index}": f"other-{index}" for index in range(bystanders)}
        | {"t": "target"},
    )
    return acl, roles


@pytest.mark.parametrize("size", [1, 20, 200])
def test_evaluation_visits_each_relevant_entry_once(size: int) -> None:
    acl, roles = counted_acl(size, bystanders=100)
    decision = acl.check(ctx(agent="t"), QUEUE, "/q", WRITE)
    assert decision == Decision(True, "target", None)
    assert sum(len(role.calls) for role in roles) == size


def test_a_check_takes_microseconds() -> None:
    acl, _ = counted_acl(20, bystanders=0)
    context = ctx(agent="t")
    runs = 2000
    best = min(timeit.repeat(lambda: acl.check(context, QUEUE, "/q", WRITE), number=runs, repeat=5))
    # About 4 us here (20 regexes and 20 role calls); the bound leaves room for slow runners.
    assert best / runs < 100e-6


# --------------------------------------------------------------------------
# The loader


EXAMPLE: Final = """
[security.policies.default]
entries = [ { action = "DENY", types = ["TOPIC","QUEUE"], destination = "/private/.*", privileges = ["READ","WRITE"], condition = { always = true } } ]
[security.policies.vip]
inherits = "default"
entries = [ { action = "PERMIT", types = ["QUEUE"], destination = "/specialQueue", privileges = ["WRITE"], condition = { and = [ { role = "VIP_role" }, { channel_type = ["CONFIDENTIALITY"] } ] } }, { action = "DENY", types = ["QUEUE"], destination = "/specialQueue", privileges = ["WRITE"], condition = { always = true } } ]
[security.agents]
billing = "vip"   # agent identity -> policy
[security.roles]
admin = "vip"     # subject role -> policy
"""  # noqa: E501 - TOML inline tables stay on one line

EXAMPLE_AS_TABLES: Final = """
[security.policies.default]

[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC", "QUEUE"]
destination = '/private/.*'
privileges = ["READ", "WRITE"]
condition = { always = true }

[security.policies.vip]
inherits = "default"

[[security.policies.vip.entries]]
action = "PERMIT"
types = "QUEUE"
destination = '/specialQueue'
privileges = "WRITE"
condition = { and = [
  { role = "VIP_role" },
  { channel_type = "CONFIDENTIALITY" },
] }

[[security.policies.vip.entries]]
action = "DENY"
types = ["QUEUE"]
destination = '/specialQueue'
privileges = ["WRITE"]
condition = { always = true }

[security.agents]
billing = "vip"

[security.roles]
admin = "vip"
"""


def test_load_example() -> None:
    acl = load_acl(EXAMPLE)
    assert acl.source == "<string>"
    assert acl.policy_names == ("default", "vip")
    vip = acl.stack("vip")
    assert [(e.action, e.destination.pattern) for e in vip] == [
        (PERMIT, "/specialQueue"),
        (DENY, "/specialQueue"),
        (DENY, "/private/.*"),
        (DENY, "/system/.*"),
    ]
    assert vip[0].condition == And(
        (Role("VIP_role"), ChannelType(frozenset({ChannelProperty.CONFIDENTIALITY})))
    )
    assert [e.line for e in vip] == [6, 6, 3, None]
    assert acl.policy_for(ctx(agent="billing")) == "vip"
    assert acl.policy_for(ctx(None, "admin")) == "vip"
    assert acl.policy_for(ANYONE) == "default"


def test_both_entry_styles_load_the_same() -> None:
    inline, tables = load_acl(EXAMPLE), load_acl(EXAMPLE_AS_TABLES)
    for name in ("default", "vip"):
        assert inline.stack(name) == tables.stack(name)
    assert [e.line for e in tables.stack("vip")] == [14, 24, 4, None]


def test_load_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("port = 8443\n[channels]\nmax_in_flight = 4\n" + EXAMPLE, encoding="utf-8")
    acl = load_acl(path)
    assert acl.source == str(path)
    assert acl.stack("vip") == load_acl(EXAMPLE).stack("vip")
    assert load_acl(path, name="conf").source == "conf"


def test_load_file_errors(tmp_path: Path) -> None:
    with pytest.raises(AclConfigError, match=r"missing\.toml: cannot read: No such file"):
        load_acl(tmp_path / "missing.toml")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"# caf\xe9\n")
    with pytest.raises(AclConfigError, match="not UTF-8 text"):
        load_acl(latin)


def test_load_refuses_bad_toml() -> None:
    with pytest.raises(AclConfigError) as caught:
        load_acl('[security]\nx = "unterminated\n', name="broker.toml")
    assert caught.value.line == 2
    assert str(caught.value).startswith("broker.toml:2: not valid TOML: ")


def test_no_security_table_allows_everything() -> None:
    acl = load_acl("port = 8443\n[channels]\nmax_in_flight = 4\n")
    assert not acl.enabled
    assert acl.check(ANYONE, QUEUE, "/system/x", WRITE) == Decision(True, None, None)
    assert acl_from_config({}).enabled is False


def test_empty_security_table_guards_system() -> None:
    acl = load_acl("[security]\n")
    assert acl.enabled
    assert acl.stack(DEFAULT_POLICY) == (SYSTEM_ENTRY,)
    assert not acl.check(ANYONE, TOPIC, "/system/x", WRITE).allowed
    assert acl.check(ANYONE, TOPIC, "/other", WRITE).allowed


def test_from_a_parsed_document() -> None:
    document = tomllib.loads(EXAMPLE)
    assert acl_from_config(document).stack("vip") == load_acl(EXAMPLE).stack("vip")
    broken = tomllib.loads('[security.policies.x]\ninherits = "nobody"\n')
    with pytest.raises(AclConfigError) as caught:
        acl_from_config(broken, source="broker.toml")
    assert caught.value.line is None  # no text, no line
    assert str(caught.value) == "broker.toml: policy 'x' inherits from unknown policy 'nobody'"


# Other settings of the broker come first, with strings that look like policies,
# so that a line number found by naive searching would be wrong.
PREAMBLE: Final = '''# The broker's own settings.
port = 8443
motd = """
[security.policies.fake]
entries = [ { action = "ALLOW" } ]  # <- not this one
"""
banner = 'a [literal] string with "quotes" and # no comment'
started = 1979-05-27 07:32:00Z
channels.long_poll_timeout = 25.0   # seconds
'''

# (name, the [security] part with "# <-" on the line to blame, what the message says)
LINE_CASES: Final = [
    (
        "unknown action",
        """
[security.policies.default]
entries = [
  { action = "DENY", types = ["TOPIC"], destination = '/a', privileges = ["READ"], condition = { always = true } },
  { action = "ALLOW", types = ["TOPIC"], destination = '/b', privileges = ["READ"], condition = { always = true } },  # <-
]
""",  # noqa: E501 - TOML inline tables stay on one line
        "policy 'default', entries[1]: action: unknown value 'ALLOW' (expected PERMIT or DENY)",
    ),
    (
        "unknown type",
        """
[security.policies.vip]
[[security.policies.vip.entries]]
action = "DENY"
types = ["TOPIC", "TOPIC_AS_QUEUE"]  # <-
destination = '/a'
privileges = ["READ"]
condition = { always = true }
""",
        "policy 'vip', entries[0]: types: unknown value 'TOPIC_AS_QUEUE' (expected one of "
        "TOPIC, QUEUE, VIRTUAL_QUEUE, COMMAND, COURSE); Sapo-Broker's TOPIC_AS_QUEUE is "
        "written "
        "VIRTUAL_QUEUE here",
    ),
    (
        "missing destination",
        """
[security.policies.default]
[[security.policies.default.entries]]  # <-
action = "DENY"
types = ["TOPIC"]
privileges = ["READ"]
condition = { always = true }
""",
        "policy 'default', entries[0]: missing 'destination'",
    ),
    (
        "bad regex",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { always = true }
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a/(b'  # <-
privileges = ["READ"]
condition = { always = true }
""",
        "policy 'default', entries[1]: destination '/a/(b': not a valid regular expression: "
        "missing ), unterminated subpattern at position 3",
    ),
    (
        "unbounded regex",
        """
[security.policies.default]
entries = [
  { action = "DENY", types = ["TOPIC"], destination = '/(a+)+', privileges = ["READ"], condition = { always = true } },  # <-
]
""",  # noqa: E501 - TOML inline tables stay on one line
        "policy 'default', entries[0]: destination '/(a+)+': nested quantifiers",
    ),
    (
        "unknown condition key, nested",
        """
[security.policies.default]
entries = [
  { action = "DENY", types = ["TOPIC"], destination = '/a', privileges = ["READ"], condition = { and = [
      { role = "staff" },
      { adress = "10.0.0.0/8" },  # <-
  ] } },
]
""",  # noqa: E501 - TOML inline tables stay on one line
        "policy 'default', entries[0]: unknown condition 'adress'; did you mean 'address'?",
    ),
    (
        "Sapo's condition name",
        """
[security.policies.default]
entries = [
  { action = "DENY", types = ["TOPIC"], destination = '/a', privileges = ["READ"], condition = { CHANNELTYPE = "CONFIDENTIALITY" } },  # <-
]
""",  # noqa: E501 - TOML inline tables stay on one line
        "unknown condition 'CHANNELTYPE'; Sapo-Broker's CHANNELTYPE is written channel_type here",
    ),
    (
        "bad CIDR",
        """
[security.policies.default]

[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { address = "10.11.12.5/24" }  # <-
""",
        "policy 'default', entries[0]: address '10.11.12.5/24': not an IP network in CIDR "
        "notation: 10.11.12.5/24 has host bits set",
    ),
    (
        "unknown parent",
        """
[security.policies.default]
[security.policies."very special policy"]
inherits = "special policy"  # <-
""",
        "policy 'very special policy' inherits from unknown policy 'special policy'",
    ),
    (
        "inheritance cycle",
        """
[security.policies.x]
inherits = "b"
[security.policies.a]
inherits = "b"  # <-
[security.policies.b]
inherits = "a"
""",
        "policy 'a' is part of an inheritance cycle: b -> a -> b",
    ),
    (
        "inheritance cycle of one",
        """
[security.policies.default]
[security.policies.self]
entries = []
inherits = "self"  # <-
""",
        "policy 'self' is part of an inheritance cycle: self -> self",
    ),
    (
        "agent with unknown policy",
        """
[security.policies.vip]
[security.agents]
billing = "vp"  # <-
""",
        "agent 'billing' is assigned unknown policy 'vp' (known: 'vip', 'default')",
    ),
    (
        "role with unknown policy",
        """
[security.roles]
admin = "default"
"super user" = "root"  # <-
""",
        "role 'super user' is assigned unknown policy 'root'",
    ),
    (
        "empty agent name",
        """
[security.agents]
"" = "default"  # <-
""",
        "an empty agent name cannot be assigned a policy",
    ),
    (
        "agent assigned a number",
        """
[security.agents]
billing = 5  # <-
""",
        "[security.agents] 'billing' must name a policy, not the number 5",
    ),
    (
        "missing condition",
        """
[security.policies.default]
entries = [
  { action = "DENY", types = ["TOPIC"], destination = '/a', privileges = ["READ"] },  # <-
]
""",
        "policy 'default', entries[0]: missing 'condition' (condition = { always = true } "
        "applies it always)",
    ),
    (
        "two condition keys",
        """
[security.policies.default]
entries = [{ action = "DENY", types = ["TOPIC"], destination = '/a', privileges = ["READ"], condition = { role = "a", address = "10.0.0.0/8" } }]  # <-
""",  # noqa: E501 - TOML inline tables stay on one line
        "a condition has exactly one key (always, address, role, channel_type, and); combine "
        "several with and = [ {...}, {...} ]",
    ),
    (
        "always false",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition.always = false  # <-
""",
        "always must be true (an entry that never applies is a no-op)",
    ),
    (
        "condition not a table",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = "always"  # <-
""",
        "policy 'default', entries[0]: condition must be a table, not the string 'always'",
    ),
    (
        "unknown entry key",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destinaton = '/a'  # <-
privileges = ["READ"]
condition = { always = true }
""",
        "policy 'default', entries[0]: unknown key 'destinaton'; did you mean 'destination'?",
    ),
    (
        "unknown policy key",
        """
[security.policies.vip]
inherit = "default"  # <-
""",
        "policy 'vip': unknown key 'inherit'; did you mean 'inherits'?",
    ),
    (
        "unknown security key",
        """
[security.policy.vip]  # <-
inherits = "default"
""",
        "[security]: unknown key 'policy'; did you mean 'policies'?",
    ),
    (
        "security not a table",
        """
security = "on"  # <-
""",
        "[security] must be a table, not the string 'on'",
    ),
    (
        "policy not a table",
        """
[security.policies]
vip = 5  # <-
""",
        "policy 'vip' must be a table, not the number 5",
    ),
    (
        "policies not a table",
        """
[security]
policies = ["vip"]  # <-
""",
        "[security.policies] must be a table, not an array",
    ),
    (
        "empty policy name",
        """
[security.policies.""]  # <-
""",
        "policy '': a security policy needs a name",
    ),
    (
        "inherits not a name",
        """
[security.policies.vip]
inherits = ["default"]  # <-
""",
        "policy 'vip': inherits must name a policy, not an array",
    ),
    (
        "lowercase default action",
        """
[security.policies.vip]
default_action = "deny"  # <-
""",
        "policy 'vip': default_action: unknown value 'deny' (expected PERMIT or DENY); did "
        "you mean 'DENY'?",
    ),
    (
        "entries not an array",
        """
[security.policies.vip]
entries = { action = "DENY" }  # <-
""",
        "policy 'vip': entries must be an array of tables, not a table",
    ),
    (
        "entry not a table",
        """
[security.policies.vip]
entries = [
  "DENY everything",  # <-
]
""",
        "policy 'vip', entries[0] must be a table, not the string 'DENY everything'",
    ),
    (
        "unknown privilege",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = [
  "WRITE",
  "EXECUTE",  # <-
]
condition = { always = true }
""",
        "privileges: unknown value 'EXECUTE' (expected READ or WRITE)",
    ),
    (
        "type listed twice",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC", "TOPIC"]  # <-
destination = '/a'
privileges = ["READ"]
condition = { always = true }
""",
        "types: TOPIC is listed twice",
    ),
    (
        "Sapo's space-separated list",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = "TOPIC QUEUE"  # <-
destination = '/a'
privileges = ["READ"]
condition = { always = true }
""",
        "types: unknown value 'TOPIC QUEUE' (expected one of TOPIC, QUEUE, VIRTUAL_QUEUE, "
        'COMMAND, COURSE); list several as an array: ["TOPIC", "QUEUE"]',
    ),
    (
        "empty types",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = []  # <-
destination = '/a'
privileges = ["READ"]
condition = { always = true }
""",
        "types must be a non-empty array of names, not an array",
    ),
    (
        "action not a name",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = true  # <-
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { always = true }
""",
        "action must be one of PERMIT, DENY, not a boolean",
    ),
    (
        "destination not a string",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = 1979-05-27  # <-
privileges = ["READ"]
condition = { always = true }
""",
        "destination must be a string, not a date or time",
    ),
    (
        "empty destination",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = ''  # <-
privileges = ["READ"]
condition = { always = true }
""",
        "destination '': a destination pattern must not be empty",
    ),
    (
        "unknown channel property",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { channel_type = ["SECRECY"] }  # <-
""",
        "channel_type: unknown value 'SECRECY' (expected one of CONFIDENTIALITY, INTEGRITY, "
        "AUTHENTICITY)",
    ),
    (
        "empty and",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { and = [] }  # <-
""",
        "and must be a non-empty array of conditions",
    ),
    (
        "empty role",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { role = "" }  # <-
""",
        "role must be a non-empty string, not the string ''",
    ),
    (
        "address not a string",
        """
[security.policies.default]
[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/a'
privileges = ["READ"]
condition = { address = 167772160 }  # <-
""",
        "address must be a string such as '10.0.0.0/8', not the number 167772160",
    ),
    (
        "float where a name belongs",
        """
[security.policies.default]
default_action = 0.5  # <-
""",
        "default_action must be one of PERMIT, DENY, not the number 0.5",
    ),
]


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if line.endswith("# <-")]
    assert len(lines) == 1, "mark exactly one line with '# <-'"
    return lines[0]


@pytest.mark.parametrize(
    ("security", "message"),
    [case[1:] for case in LINE_CASES],
    ids=[case[0] for case in LINE_CASES],
)
def test_loader_error_names_the_line(security: str, message: str) -> None:
    text = PREAMBLE + security
    with pytest.raises(AclConfigError) as caught:
        load_acl(text, name="broker.toml")
    error = caught.value
    assert message in error.detail
    line = marked_line(text)
    blamed = text.splitlines()[(error.line or 1) - 1]
    assert error.line == line, f"blamed line {error.line}: {blamed!r}"
    assert error.source == "broker.toml"
    assert str(error) == f"broker.toml:{line}: {error.detail}"


# --------------------------------------------------------------------------
# toml_lines: key paths to lines


def paths(value: object, prefix: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key path in a parsed TOML value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from paths(item, (*prefix, index))


TRICKY: Final = "\n".join(
    [
        '# comment with [brackets] and "quotes"',
        'title = "a \\"quoted\\" value # not a comment"',
        "literal = 'C:\\path\\'",
        '"quoted.key" = 1',
        "'single' = 2",
        "dotted.key.here = 3   # trailing comment",
        '"esc\\u0041ped" = 4',
        'multi = """',
        'line one \\"""',
        "[not.a.table]",
        'still "" in the string""""',
        "multi_literal = '''",
        "[not.a.table]",
        "'''''",
        "date = 1979-05-27 07:32:00-08:00",
        "numbers = [ 1, 2,",
        "  3,  # comment inside an array",
        '  [4, 5], { inline = "table", nested = { deep = [ "x" ] } },',
        "]",
        '[table . "with spaces"]',
        "a = true",
        "[[fruits]]",
        'name = "apple"',
        "[fruits.physical]",
        'color = "red"',
        "[[fruits.varieties]]",
        'name = "red delicious"',
        "[[fruits.varieties]]",
        'name = "granny smith"',
        "[[fruits]]",
        'name = "banana"',
        "[[fruits.varieties]]",
        'name = "plantain"',
        "",
    ]
)


def test_key_lines_cover_every_key() -> None:
    lines = key_lines(TRICKY)
    parsed = tomllib.loads(TRICKY)
    assert set(paths(parsed)) <= set(lines)


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (("title",), 2),
        (("literal",), 3),
        (("quoted.key",), 4),
        (("single",), 5),
        (("dotted",), 6),
        (("dotted", "key", "here"), 6),
        (("escAped",), 7),
        (("multi",), 8),
        (("multi_literal",), 12),
        (("date",), 15),
        (("numbers",), 16),
        (("numbers", 2), 17),
        (("numbers", 3, 1), 18),
        (("numbers", 4, "nested", "deep", 0), 18),
        (("table", "with spaces", "a"), 21),
        (("fruits", 0), 22),
        (("fruits", 0, "physical", "color"), 25),
        (("fruits", 0, "varieties", 1, "name"), 29),
        (("fruits", 1), 30),
        (("fruits", 1, "varieties", 0), 32),
        (("fruits", 1, "varieties", 0, "name"), 33),
    ],
)
def test_key_lines(path: KeyPath, line: int) -> None:
    assert key_lines(TRICKY)[path] == line


def test_key_lines_with_crlf() -> None:
    text = "a = 1\r\n[t]\r\nb = [\r\n  2,\r\n]\r\n"
    assert key_lines(text) == {("a",): 1, ("t",): 2, ("t", "b"): 3, ("t", "b", 0): 4}


@pytest.mark.parametrize(
    "text",
    [
        'a = 1\nb = "unterminated',
        "a = 1\nb = '''open",
        "a = 1\n= 2",
        "a = 1\n[t",
        'a = 1\nb = "x\ny"',
        "a = 1\nb = ",
    ],
)
def test_key_lines_stop_on_text_they_cannot_follow(text: str) -> None:
    assert key_lines(text)[("a",)] == 1


# --------------------------------------------------------------------------
# Sapo-Broker's sample (docs/acl.md), and what Sapo says it means


def docs() -> str:
    return DOCS.read_text(encoding="utf-8")


def fenced(text: str, info: str) -> list[str]:
    return re.findall(rf"^```{re.escape(info)}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def sapo_sample() -> str:
    section = docs().split("## Sapo-Broker's sample, translated", 1)[1]
    return fenced(section, "toml")[0]


@pytest.fixture(scope="module")
def sapo() -> Acl:
    return load_acl(sapo_sample(), name="broker.toml")


A007 = ctx("192.0.2.1", agent="agent007")
A007_OFFICE = ctx("10.11.12.9", agent="agent007")
VIP_TLS = ctx(None, "VIP_role", properties=TLS, agent="agent007")
VIP_CLEAR = ctx(None, "VIP_role", agent="agent007")
STAFF_MTLS = ctx(None, "staff", properties=MTLS, agent="agent007")

# (Sapo's claim, who asks, "TYPE destination PRIVILEGE", allowed)
SAPO_CASES: Final = [
    # "no client can produce messages to topic or queue whose named begin with /system/"
    ("no producing to /system/ topics", ANYONE, "TOPIC /system/stats/x WRITE", False),
    ("no producing to /system/ queues", ANYONE, "QUEUE /system/x WRITE", False),
    ("agent007: no producing to /system/", A007, "TOPIC /system/x WRITE", False),
    ("/system/ can be read", ANYONE, "TOPIC /system/stats/x READ", True),
    # "destination names beginning with /private/ are forbidden for all clients"
    ("/private/ topic read", ANYONE, "TOPIC /private/x READ", False),
    ("/private/ queue write", ANYONE, "QUEUE /private/x WRITE", False),
    ("/private/ virtual queue", ANYONE, "VIRTUAL_QUEUE /private/x READ", False),
    ("agent007: /private/ read", A007, "TOPIC /private/x READ", False),
    ("agent007: /private/ from 10.11.12/24", A007_OFFICE, "QUEUE /private/x READ", False),
    ("agent007: /private/ write", A007, "TOPIC /private/x WRITE", False),
    ("VIP: /private/ still forbidden", VIP_TLS, "QUEUE /private/x WRITE", False),
    # "production to /specialQueue is denied to all except those clients that simultaneous
    # possess the role VIP_role and are using a channel that offers confidentiality"
    ("VIP over TLS may produce", VIP_TLS, "QUEUE /specialQueue WRITE", True),
    ("VIP in clear may not", VIP_CLEAR, "QUEUE /specialQueue WRITE", False),
    ("TLS without the role may not", STAFF_MTLS, "QUEUE /specialQueue WRITE", False),
    ("nobody else under agent007", A007, "QUEUE /specialQueue WRITE", False),
    ("consuming it is not restricted", A007, "QUEUE /specialQueue READ", True),
    ("only the queue is restricted", A007, "TOPIC /specialQueue WRITE", True),
    ("only that name", A007, "QUEUE /specialQueue2 WRITE", True),
    # The default policy does not restrict it, and allows what no entry mentions.
    ("default policy may produce to it", ANYONE, "QUEUE /specialQueue WRITE", True),
    ("the rest is allowed", ANYONE, "TOPIC /topic/foo WRITE", True),
]


@pytest.mark.parametrize(
    ("context", "request_", "allowed"),
    [case[1:] for case in SAPO_CASES],
    ids=[case[0] for case in SAPO_CASES],
)
def test_sapo_sample(sapo: Acl, context: AccessContext, request_: str, allowed: bool) -> None:
    kind, destination, privilege = request_.split(" ")
    decision = sapo.check(context, DestinationType[kind], destination, Privilege[privilege])
    assert decision.allowed is allowed


def test_sapo_sample_structure(sapo: Acl) -> None:
    assert sapo.policy_names == ("default", "anotherPolicy", "very special policy")
    assert len(sapo.stack("anotherPolicy")) == 3 + 2 + 1
    assert len(sapo.stack("very special policy")) == 1 + 3 + 2 + 1
    vip = ctx(None, "brk_writer_role", properties=TLS)
    # Assigned to no agent, but its stack behaves as Sapo's declaration says.
    special = sapo.stack("very special policy")[0]
    assert special.applies(vip, TOPIC, "/topic/sensitive", WRITE)
    assert not special.applies(ctx(None, "brk_writer_role"), TOPIC, "/topic/sensitive", READ)


def test_sapo_sample_as_written_is_refused() -> None:
    # Sapo's "very special policy" inherits "special policy", which it never declares.
    literal = sapo_sample().replace('inherits = "anotherPolicy"', 'inherits = "special policy"')
    with pytest.raises(
        AclConfigError, match="inherits from unknown policy 'special policy'"
    ) as caught:
        load_acl(literal)
    assert caught.value.line == literal.splitlines().index('inherits = "special policy"') + 1


# --------------------------------------------------------------------------
# docs/acl.md agrees with the code


def test_docs_links_resolve_to_headings() -> None:
    text = docs()
    headings = re.findall(
        r"^#{1,6} (.*)$", re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S), re.M
    )
    # GitHub's anchors: lowercase, punctuation dropped, spaces to hyphens.
    anchors = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links
    assert set(links) <= anchors


def test_docs_toml_examples_load() -> None:
    examples = fenced(docs(), "toml")
    assert len(examples) >= 3
    for example in examples:
        assert load_acl(example).enabled


def test_docs_complete_example_behaves() -> None:
    example = next(e for e in fenced(docs(), "toml") if "billing-service" in e)
    acl = load_acl(example)
    billing = ctx(agent="billing-service")
    assert acl.check(billing, COMMAND, "billing.charge", WRITE).allowed
    assert acl.check(billing, COMMAND, "asbp.ping", WRITE).allowed
    assert not acl.check(billing, COMMAND, "chat.send", WRITE).allowed
    assert not acl.check(billing, TOPIC, "/system/x", WRITE).allowed
    admin = ctx(None, "staff", "admin", properties=MTLS)
    assert acl.policy_for(admin) == "admin"
    assert acl.check(admin, COMMAND, "admin.restart", WRITE).allowed
    assert not acl.check(
        ctx(None, "admin", properties=TLS), COMMAND, "admin.restart", WRITE
    ).allowed
    office = ctx("2001:db8:11::7", "staff")
    assert acl.check(office, QUEUE, "/private/reports/q1", READ).allowed
    assert not acl.check(office, QUEUE, "/private/reports/q1", WRITE).allowed
    assert not acl.check(
        ctx("::ffff:10.11.13.1", "staff"), QUEUE, "/private/reports/q1", READ
    ).allowed
    assert acl.check(ctx("::ffff:10.11.12.1", "staff"), QUEUE, "/private/reports/q1", READ).allowed


def test_docs_broken_example_fails_as_shown() -> None:
    text = docs()
    (broken,) = fenced(text, "toml broken")
    shown = text.split(broken, 1)[1]
    expected = fenced(shown, "text")[0].strip()
    with pytest.raises(AclConfigError) as caught:
        load_acl(broken, name="broker.toml")
    assert str(caught.value) == expected


def test_docs_show_the_real_fault_and_log_texts(sapo: Acl) -> None:
    text = " ".join(docs().split())
    denied = AccessDenied(COMMAND, "chat.send", WRITE, Decision(False, "default", 0))
    assert f"code=3201,e=UTF-8,u=9,cause=chat.send;{denied.message}" in text
    decision = sapo.check(A007, QUEUE, "/specialQueue", WRITE)
    assert f"`{sapo.describe(decision)}`" in text
    assert "3201" in text and "FaultCode.ACCESS_DENIED" in text


# --------------------------------------------------------------------------
# The package: exports and purity


MODULES: Final = [conditions, entries, errors, loader, patterns, policy, toml_lines]


def test_exports() -> None:
    exported: set[str] = set()
    for module in MODULES:
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
        exported |= set(module.__all__)
    assert set(gateway.acl.__all__) == exported - {"FLAGS", "KeyPath", "key_lines"}
    assert sorted(gateway.acl.__all__) == sorted(set(gateway.acl.__all__))
    for name in gateway.acl.__all__:
        assert getattr(gateway.acl, name) is not None


ALLOWED_IMPORTS: Final = {
    "__future__",
    "bisect",
    "collections",
    "contextlib",
    "dataclasses",
    "datetime",
    "difflib",
    "enum",
    "ipaddress",
    "os",
    "pathlib",
    "re",
    "sre_constants",
    "sre_parse",
    "tomllib",
    "types",
    "typing",
    "asbp",
    "gateway",
}


@pytest.mark.parametrize(
    "module", [*MODULES, gateway.acl, gateway.errors], ids=lambda m: m.__name__
)
def test_pure(module: Any) -> None:
    """No asyncio, sockets, logging or servers; only the loader reads a file.

    The one gateway module outside gateway.acl it may import is gateway.errors (the
    root of its errors), which is held to the same rule here.
    """
    source = Path(module.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            imported.add(node.module)
    for name in imported:
        assert name.split(".")[0] in ALLOWED_IMPORTS, f"{module.__name__} imports {name}"
        if name.startswith("gateway"):
            assert name.startswith("gateway.acl") or name == "gateway.errors", (
                f"{module.__name__} imports {name}"
            )
    if module is not loader:
        assert "read_text" not in source and "open(" not in source
