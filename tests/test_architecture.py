"""docs/architecture.md matches the folders: every path it names exists, and every
package of the broker and the SDK appears on the map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
TOP = ("asbp", "gateway", "agents", "courses", "tests")

#: A backticked path into one of the project's packages: `gateway/routing/router.py`.
PATH = re.compile(r"`((?:" + "|".join(TOP) + r")/[A-Za-z0-9_./]*)`")


def named_paths(text: str) -> list[str]:
    return PATH.findall(text)


def test_the_doc_names_paths() -> None:
    # The pattern must see the map; an empty match would make the next test vacuous.
    assert len(named_paths(DOC.read_text())) > 50


def test_every_path_the_doc_names_exists() -> None:
    missing = [p for p in named_paths(DOC.read_text()) if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_is_on_the_map() -> None:
    named = {p.rstrip("/") for p in named_paths(DOC.read_text())}
    packages = sorted(
        init.parent.relative_to(ROOT).as_posix()
        for top in ("asbp", "gateway", "agents", "courses")
        for init in (ROOT / top).rglob("__init__.py")
        if init.parent != ROOT / top
    )
    absent = [
        p for p in packages if p not in named and not any(n.startswith(p + "/") for n in named)
    ]
    assert not absent, f"packages missing from docs/architecture.md: {absent}"


def test_a_missing_path_is_found() -> None:
    assert named_paths("see `gateway/no_such_module.py` and `asbp/codec.py`") == [
        "gateway/no_such_module.py",
        "asbp/codec.py",
    ]
