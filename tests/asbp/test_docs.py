"""docs/protocol.md checked against the code, so that the two cannot drift.

The tables (reserved keys, typed accessors, limits, fault codes, error
classes) are parsed out of the Markdown and compared with the objects they
describe. The ABNF is checked against the grammar's regular expressions for
every code point. The example frames are decoded. The links between the pages
must resolve to headings.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from pathlib import Path

from asbp import (
    DEFAULT_LIMITS,
    RESERVED_KEYS,
    Command,
    FaultCode,
    Limits,
    ProtocolError,
    decode,
    errors,
    faults,
    grammar,
)
from asbp.grammar import BARE_CHAR_RE, ITEM_RE, RESERVED

DOCS = Path(__file__).resolve().parents[2] / "docs"

Row = tuple[str, ...]

#: Every code point, lone surrogates included (a str may hold them).
ALL_CODE_POINTS = range(sys.maxunicode + 1)
SURROGATES = range(0xD800, 0xE000)


@functools.cache
def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def cell(text: str) -> str:
    """A cell's text, without a code span that wraps the whole cell."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "`" and "`" not in text[1:-1]:
        return text[1:-1]
    return text


def table(*columns: str) -> list[Row]:
    """The rows of the one table in protocol.md headed by ``columns``."""
    lines = read("protocol.md").splitlines()
    header = "| " + " | ".join(columns) + " |"
    starts = [n for n, line in enumerate(lines) if line == header]
    assert len(starts) == 1, f"expected one table headed {header!r}, found {len(starts)}"
    start = starts[0]
    assert re.fullmatch(r"\|(?:-+\|)+", lines[start + 1]), "no delimiter row"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        assert line.endswith("|"), line
        row = tuple(cell(text) for text in line[1:-1].split("|"))
        assert len(row) == len(columns), line
        rows.append(row)
    assert rows, f"table {header!r} is empty"
    return rows


# -- tables -----------------------------------------------------------------


def test_reserved_key_table_is_reserved_keys() -> None:
    expected = [(k.key, k.name, k.arity.value, k.rule) for k in RESERVED_KEYS.values()]
    assert table("key", "name", "arity", "our rule") == expected


def test_accessor_table_matches_command() -> None:
    rows = table("key", "accessor", "returns", "when absent")
    assert [key for key, *_ in rows] == list(RESERVED_KEYS)
    without = Command(zz="x")
    for key, accessor, returns, absent in rows:
        prop = inspect.getattr_static(Command, accessor)
        assert isinstance(prop, property), accessor
        assert prop.__doc__ is not None
        assert prop.__doc__.startswith(f"``{key}``"), (key, accessor)
        assert absent in ("None", "()"), absent
        annotation = inspect.get_annotations(prop.fget)["return"]
        assert annotation == (f"{returns} | None" if absent == "None" else returns), accessor
        assert getattr(without, accessor) == {"None": None, "()": ()}[absent], accessor


def test_limits_table_is_default_limits() -> None:
    rows = table("Limits field", "default", "what it counts", "fault")
    assert [field for field, *_ in rows] == [f.name for f in dataclasses.fields(Limits)]
    for field, default, _, fault in rows:
        assert int(default.split()[0]) == getattr(DEFAULT_LIMITS, field), field
        match = re.fullmatch(r"(\d{4}) `(\w+)`", fault)
        assert match is not None, fault
        assert getattr(errors, match[2]).code == int(match[1]), field


def fault_origins() -> dict[str, str]:
    """Each FaultCode member's origin, read from the ``#:`` comments in faults.py."""
    found = re.findall(r"#: (.*)\n\s+([A-Z_]+) = \d+", inspect.getsource(faults))
    origins = {
        name: "extension" if comment.startswith("Extension:") else "Sapo-Broker"
        for comment, name in found
    }
    assert set(origins) == set(FaultCode.__members__)
    return origins


def test_fault_table_is_fault_code() -> None:
    rows = table("code", "name", "description", "origin")
    origins = fault_origins()
    expected = [
        (str(int(code)), code.name, code.description, origins[code.name]) for code in FaultCode
    ]
    assert rows == expected
    # Spelled out too, so a failure names the culprit.
    for code, name, description, _ in rows:
        assert FaultCode(int(code)).name == name
        assert FaultCode(int(code)).description == description


def test_error_table_is_the_error_tree() -> None:
    rows = table("class", "code", "raised when")
    leaves = {
        name
        for name in errors.__all__
        if issubclass(getattr(errors, name), ProtocolError) and name != "ProtocolError"
    }
    assert {name for name, *_ in rows} == leaves
    for name, code, _ in rows:
        assert getattr(errors, name).code == int(code), name


# -- the ABNF ----------------------------------------------------------------


def strip_comment(line: str) -> str:
    """``line`` up to its ABNF comment (a ";" outside a quoted string)."""
    quoted = False
    for index, char in enumerate(line):
        if char == '"':
            quoted = not quoted
        elif char == ";" and not quoted:
            return line[:index]
    return line


@functools.cache
def abnf() -> dict[str, str]:
    """The rules of the one ```abnf block: name -> definition, comments dropped."""
    blocks = re.findall(r"^```abnf\n(.*?)^```$", read("protocol.md"), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1
    rules: dict[str, str] = {}
    name = ""
    for line in blocks[0].splitlines():
        code = strip_comment(line)
        if not code.strip():
            continue
        if line[0].isspace():
            assert name, line
            rules[name] += " " + code.strip()
        else:
            name, equals, definition = code.partition("=")
            name = name.strip()
            assert equals, line
            assert name not in rules, name
            rules[name] = definition.strip()
    return rules


def code_points(rule: str) -> set[int]:
    """The code points of a rule made only of %x values and ranges."""
    points: set[int] = set()
    for alternative in abnf()[rule].split("/"):
        match = re.fullmatch(r"%x([0-9A-F]+)(?:-([0-9A-F]+))?", alternative.strip())
        assert match is not None, (rule, alternative)
        points.update(range(int(match[1], 16), int(match[2] or match[1], 16) + 1))
    return points


def test_abnf_reserved_is_grammar_reserved() -> None:
    literals = re.findall(r'"(.)"', abnf()["reserved"])
    assert len(literals) == len(set(literals))
    assert set(literals) == RESERVED
    block = re.search(r"^```abnf\n.*?^```$", read("protocol.md"), re.MULTILINE | re.DOTALL)
    assert block is not None
    for char in RESERVED:
        assert f'"{char}"' in block[0], char


def test_abnf_has_every_rule_of_grammar_py() -> None:
    assert grammar.__doc__ is not None
    names = set(re.findall(r"^ {4}([a-z][a-z-]*) += ", grammar.__doc__, re.MULTILINE))
    assert names, "no ABNF in grammar.py's docstring"
    assert names <= set(abnf())


def test_abnf_white_space_is_str_isspace() -> None:
    assert code_points("white-space") == {cp for cp in ALL_CODE_POINTS if chr(cp).isspace()}


def test_abnf_bare_char_is_the_grammar() -> None:
    excluded = (
        {ord(char) for char in RESERVED}
        | code_points("white-space")
        | code_points("control")
        | set(SURROGATES)
    )
    documented = code_points("bare-char")
    assert documented.isdisjoint(excluded)
    assert len(documented) + len(excluded) == len(ALL_CODE_POINTS)
    # BARE_CHAR_RE matches one character: deleting every match leaves exactly
    # the characters it refuses.
    everything = "".join(map(chr, ALL_CODE_POINTS))
    refused = {ord(char) for char in BARE_CHAR_RE.sub("", everything)}
    assert refused == excluded


def test_abnf_quoted_char_is_the_grammar() -> None:
    documented = code_points("quoted-char")
    # A token that starts with a quote can only be a quoted token.
    accepted = {cp for cp in ALL_CODE_POINTS if ITEM_RE.fullmatch(f"'{chr(cp)}'")}
    assert documented == accepted
    assert set(ALL_CODE_POINTS) - documented == {ord("'"), ord("\r"), ord("\n")} | set(SURROGATES)


# -- examples and links ------------------------------------------------------


def test_example_frames_decode_as_documented() -> None:
    failures = []
    for frame, header, body in table("frame", "header", "body"):
        fault = re.fullmatch(r"fault (\d{4}) at byte (\d+)", header)
        try:
            command = decode(frame.encode("utf-8"))
        except ProtocolError as exc:
            if fault is None or (int(exc.code), exc.offset) != (int(fault[1]), int(fault[2])):
                failures.append(f"{frame}: {exc}")
            continue
        if fault is not None:
            failures.append(f"{frame}: decoded, but the docs say {header}")
        elif (repr(dict(command.header)), repr(command.body)) != (header, body):
            failures.append(f"{frame}: {dict(command.header)!r} {command.body!r}")
    assert not failures, "\n".join(failures)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.*)", line)):
            found.append(slug(match[1]))
    assert len(found) == len(set(found)), "two headings share an anchor"
    return set(found)


def test_links_resolve_to_headings() -> None:
    targets = anchors(read("protocol.md"))
    links = re.findall(r"\]\(#([^)]+)\)", read("protocol.md"))
    links += re.findall(r"\]\(protocol\.md#([^)]+)\)", read("index.md"))
    assert links
    assert sorted(set(links) - targets) == []
