"""Every public asbp module declares ``__all__``, sorted, naming what exists."""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import asbp

MODULES = [
    importlib.import_module(f"asbp.{info.name}")
    for info in pkgutil.iter_modules(asbp.__path__)
    if not info.name.startswith("_")
]


def _isort_key(name: str) -> tuple[int, list[int | str]]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest; natural sort."""
    group = 0 if len(name) > 1 and name.isupper() else 1 if name[:1].isupper() else 2
    return group, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def test_public_modules_found() -> None:
    names = {module.__name__ for module in MODULES}
    assert {"asbp.codec", "asbp.command", "asbp.errors", "asbp.grammar", "asbp.header"} <= names


@pytest.mark.parametrize("module", [asbp, *MODULES], ids=lambda module: module.__name__)
def test_all_is_declared_sorted_and_unique(module: ModuleType) -> None:
    assert "__all__" in vars(module)
    names = list(module.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("module", [asbp, *MODULES], ids=lambda module: module.__name__)
def test_all_names_exist(module: ModuleType) -> None:
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_package_reexports_the_same_objects() -> None:
    for name in asbp.__all__:
        owners = [m for m in MODULES if name in m.__all__]
        assert owners, f"{name} is not defined by any public module"
        assert all(getattr(m, name) is getattr(asbp, name) for m in owners)


def test_isort_key_orders_like_ruff() -> None:
    names = ["encode", "Limits", "KiB", "DEFAULT_LIMITS", "UTF8_MARKER", "a10", "a9", "Z"]
    assert sorted(names, key=_isort_key) == [
        "DEFAULT_LIMITS",
        "UTF8_MARKER",
        "KiB",
        "Limits",
        "Z",
        "a9",
        "a10",
        "encode",
    ]
