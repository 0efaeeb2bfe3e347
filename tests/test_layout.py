"""The layout of tests/: it mirrors the source tree, and tests share helpers through support/.

* Every directory of tests under ``tests/`` names a source package at the same
  path: tests of ``gateway/acl/`` are in ``tests/gateway/acl/``, of
  ``agents/spark/`` in ``tests/agents/spark/``. Two directories stand apart:
  ``tests/support/`` (the helpers) and ``tests/conformance/`` (one suite, run on
  every engine). Modules directly in ``tests/`` test what spans packages.
* Every directory of Python files is a package (``tests`` modules import
  ``tests.support``, so a missing ``__init__.py`` would make names collide).
* No module imports a test module or a ``conftest.py``: helpers live in
  ``tests/support/``, fixtures in the nearest common ``conftest.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: Directories of tests/ that mirror no source package, and why.
STANDALONE = {
    "support": "the helpers every test shares",
    "conformance": "one suite, run on every engine",
    # bench/ holds scripts, not a package: its smoke tests (each benchmark's --quick
    # mode starts and prints its ratios) have no source package to mirror.
    "bench": "smoke tests of the benchmarks in bench/",
    "browser": "the TypeScript client (agents/js, an npm package): in Node and in Chromium",
}


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def directories_of_tests() -> list[Path]:
    return sorted({p.parent for p in python_files()} - {TESTS})


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("directory", directories_of_tests(), ids=relative)
def test_every_directory_is_a_package(directory: Path) -> None:
    assert (directory / "__init__.py").is_file()


@pytest.mark.parametrize(
    "directory",
    [d for d in directories_of_tests() if d.relative_to(TESTS).parts[0] not in STANDALONE],
    ids=relative,
)
def test_every_test_directory_mirrors_a_source_package(directory: Path) -> None:
    source = ROOT / directory.relative_to(TESTS)
    assert (source / "__init__.py").is_file(), (
        f"{relative(directory)} has no source package {relative(source)}"
    )


def imported_modules(source: str, package: str) -> list[str]:
    """Every module ``source`` (a module of ``package``) imports, relative imports
    resolved; ``from x import y`` counts as both ``x`` and ``x.y`` (``y`` may be a module)."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            modules.append(module)
            modules.extend(f"{module}.{alias.name}" for alias in node.names)
    return modules


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).parent.parts)


def is_test_module_or_conftest(module: str) -> bool:
    last = module.rpartition(".")[2]
    return module.startswith("tests.") and (last.startswith("test_") or last == "conftest")


@pytest.mark.parametrize("path", python_files(), ids=relative)
def test_no_module_imports_a_test_module_or_a_conftest(path: Path) -> None:
    modules = imported_modules(path.read_text(encoding="utf-8"), package_of(path))
    offending = [m for m in modules if is_test_module_or_conftest(m)]
    assert not offending, f"{relative(path)} imports {offending}: move them to tests/support/"


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from tests.gateway.conftest import Gateway", "tests.gateway.conftest"),
        ("from tests.asbp.test_properties import commands", "tests.asbp.test_properties"),
        ("from .conftest import Engines", "tests.conformance.conftest"),
        ("from . import test_topics", "tests.conformance.test_topics"),
        ("from .. import conftest", "tests.conftest"),
        ("import tests.agents.test_application_agent", "tests.agents.test_application_agent"),
    ],
)
def test_the_import_scan_sees_each_form(source: str, module: str) -> None:
    """The scan catches each way of importing a test module or a conftest."""
    modules = imported_modules(source, "tests.conformance")
    assert module in modules
    assert is_test_module_or_conftest(module)


def test_the_import_scan_lets_support_through() -> None:
    modules = imported_modules("from tests.support.gateway import Gateway", "tests.gateway.acl")
    assert not any(is_test_module_or_conftest(m) for m in modules)
