"""Who may import whom: the SDK stands alone, and the protocol core imports no one.

::

    asbp/     imports neither gateway, agents nor courses (and no I/O:
              tests/asbp/test_purity.py)
    agents/   imports asbp and its own dependencies, never gateway or courses
    gateway/  may import asbp and, lazily, the SDK (the ``asbp analytics`` job);
              only gateway/app.py imports courses
    courses/  imports asbp and gateway, never gateway.app, .broker, .routing or .ops

So a Spark job or an Application-Agent installs and runs without the broker,
and the vocabulary both sides speak lives in ``asbp`` instead of being copied.
Every import counts: inside functions, under ``if TYPE_CHECKING:`` and in
``try`` blocks, since any of them can run. The checker is tested on snippets,
so a green run means the sources are clean, not that the checker is blind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

#: Package -> the top-level packages of this repository it must never import.
FORBIDDEN = {
    "asbp": frozenset({"gateway", "agents", "courses"}),
    "agents": frozenset({"gateway", "courses"}),
}
SOURCES = [
    (package, path)
    for package in sorted(FORBIDDEN)
    for path in sorted((ROOT / package).rglob("*.py"))
]


def imported_modules(source: str) -> list[tuple[int, str]]:
    """Every absolute module ``source`` imports, anywhere in it, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            # importlib.import_module("gateway.x") is an import all the same.
            found.append((node.lineno, node.args[0].value))
    return found


def violations(source: str, forbidden: frozenset[str]) -> list[str]:
    """The imports of ``source`` whose top-level package is in ``forbidden``."""
    return [
        f"{line}: {module}"
        for line, module in imported_modules(source)
        if module.partition(".")[0] in forbidden
    ]


def test_every_package_is_checked() -> None:
    checked = {(package, path.relative_to(ROOT / package).as_posix()) for package, path in SOURCES}
    assert {
        ("asbp", "names.py"),
        ("agents", "control.py"),
        ("agents", "spark/events.py"),
    } <= checked
    assert ("agents", "spark/analytics.py") in checked


@pytest.mark.parametrize(
    ("package", "path"), SOURCES, ids=[str(path.relative_to(ROOT)) for _, path in SOURCES]
)
def test_imports_stay_inside_the_boundary(package: str, path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), FORBIDDEN[package]) == []


@pytest.mark.parametrize(
    "source",
    [
        "import gateway",
        "import gateway.ops.cli",
        "import os, gateway.app",
        "from gateway import app",
        "from gateway.eventlog.schema import FIELDS",
        "import courses.link as link",
        "def main():\n    from gateway.ops.cli import main as cli",
        "if TYPE_CHECKING:\n    from gateway.broker import Broker",
        "try:\n    import gateway\nexcept ImportError:\n    pass",
        "class A:\n    def f(self):\n        import gateway",
        "importlib.import_module('gateway.ops.cli')",
        "import_module('gateway')",
        "__import__('gateway.app')",
    ],
)
def test_checker_catches(source: str) -> None:
    assert violations(source, FORBIDDEN["agents"]) != []


@pytest.mark.parametrize(
    "source",
    [
        "import asbp",
        "from asbp.names import PING",
        "import gateways",
        "from gatewayx import y",
        "from . import gateway",
        "from .gateway import x",
        "import agents.spark",
        "x = 'import gateway'",
        "importlib.import_module(name)",
    ],
)
def test_checker_allows(source: str) -> None:
    assert violations(source, FORBIDDEN["agents"]) == []


def test_asbp_may_not_import_the_sdk() -> None:
    assert violations("from agents import control", FORBIDDEN["asbp"]) != []


# -- gateway/ and courses/ ----------------------------------------------------------
#
# courses/ is built on the broker's parts (asbp, gateway.auth, gateway.engines, the
# Channel and Subject types) and is wired in by the broker's composition root, so the
# arrow points one way: gateway/app.py imports courses; no other gateway module does,
# and courses never imports what wires it (the app, the Broker, the router, ops).

#: Modules of gateway/ courses must never import (each with its submodules).
COURSES_MUST_NOT_IMPORT = ("gateway.app", "gateway.broker", "gateway.routing", "gateway.ops")
#: The one gateway module that may import courses.
COMPOSITION_ROOT = "app.py"


def module_violations(source: str, forbidden: tuple[str, ...]) -> list[str]:
    """The imports of ``source`` naming one of ``forbidden`` or a module under it."""
    return [
        f"{line}: {module}"
        for line, module in imported_modules(source)
        if any(module == name or module.startswith(name + ".") for name in forbidden)
    ]


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "courses").rglob("*.py")),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_courses_never_import_what_wires_them(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert module_violations(source, COURSES_MUST_NOT_IMPORT) == []


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in (ROOT / "gateway").rglob("*.py")
        if p.relative_to(ROOT / "gateway").as_posix() != COMPOSITION_ROOT
    ),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_only_the_composition_root_imports_courses(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), frozenset({"courses"})) == []


def test_the_composition_root_does_import_courses() -> None:
    source = (ROOT / "gateway" / COMPOSITION_ROOT).read_text(encoding="utf-8")
    assert violations(source, frozenset({"courses"})) != []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("from gateway.routing.router import Router", True),
        ("import gateway.broker", True),
        ("from gateway.app import create_app", True),
        ("from gateway.ops import server", True),
        ("from gateway.engines.base import Engine", False),
        ("from gateway.application import x", False),
    ],
)
def test_the_module_checker(source: str, caught: bool) -> None:
    assert bool(module_violations(source, COURSES_MUST_NOT_IMPORT)) is caught
