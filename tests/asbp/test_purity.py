"""asbp/ stays sans-I/O: an ``ast`` walk over its sources (STYLE.md 2.2).

Only a whitelist of pure standard-library modules may be imported, and the
builtins that reach the outside world (files, the terminal, dynamic code)
may not even be named. The checker is itself tested on bad snippets, so a
green run means the sources are clean, not that the checker is blind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import asbp

ASBP_DIR = Path(asbp.__file__).parent
SOURCES = sorted(ASBP_DIR.glob("*.py"))

#: Modules asbp/ may import, besides its own.
ALLOWED_MODULES = frozenset(
    {"__future__", "re", "dataclasses", "enum", "typing", "types", "collections.abc"}
)
#: Builtins that do I/O or run code built at runtime.
FORBIDDEN_NAMES = frozenset(
    {
        "open",
        "print",
        "input",
        "exec",
        "eval",
        "compile",
        "__import__",
        "breakpoint",
        "__builtins__",
    }
)


def _allowed(module: str) -> bool:
    return module in ALLOWED_MODULES or module == "asbp" or module.startswith("asbp.")


def violations(source: str) -> list[str]:
    """Every forbidden import or name in ``source``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if not _allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            # A relative import (level > 0) stays inside the asbp package.
            if node.level == 0 and not _allowed(node.module or ""):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES - {"compile"}:
            # re.compile is pure and everywhere; builtins.open and friends are not.
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_every_module_is_checked() -> None:
    names = {path.stem for path in SOURCES}
    assert {"__init__", "codec", "command", "errors", "faults", "grammar", "header"} <= names
    assert {"names", "fault_commands", "eventlog"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_module_is_pure(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import os",
        "import asyncio",
        "import socket, re",
        "import collections",
        "import asbpx",
        "from collections import deque",
        "from io import BytesIO",
        "from asbp_gateway import x",
        "def f():\n    import logging",
        "open('frame.bin')",
        "print('hello')",
        "input()",
        "exec('1')",
        "eval('1')",
        "compile('1', 'f', 'eval')",
        "__import__('os')",
        "breakpoint()",
        "reader = open",
        "__builtins__['open']",
        "import builtins\nbuiltins.open('x')",
    ],
)
def test_checker_catches(source: str) -> None:
    assert violations(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import re\nPATTERN = re.compile('a')",
        "from collections.abc import Mapping",
        "import collections.abc",
        "from dataclasses import dataclass",
        "from enum import IntEnum",
        "from typing import Final",
        "from types import MappingProxyType",
        "from asbp.grammar import Limits",
        "import asbp.codec",
        "from . import grammar",
        "def opener(): pass",
    ],
)
def test_checker_allows(source: str) -> None:
    assert violations(source) == []
