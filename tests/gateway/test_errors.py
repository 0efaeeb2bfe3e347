"""The one error tree: every exception class in gateway/ and asbp/ has AsbpError as root,
and the drawings in gateway/errors.py and asbp/errors.py name what exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Final

import pytest

import asbp
import asbp.errors
import courses
import gateway
import gateway.errors
from asbp import AsbpError, FaultCode
from gateway.acl import AclConfigError, PatternError, UnsafePatternError, compile_destination
from gateway.auth.errors import CredentialConfigError
from gateway.auth.trust import ServeConfigError
from gateway.config import ConfigError
from gateway.errors import GatewayError, LocalError
from gateway.ops.server import ServerError
from tests.support import T

ROOT = Path(__file__).resolve().parents[2]

# Exception classes that must not derive from AsbpError, each with the reason. There
# are none: an error raised on purpose belongs in the tree, even one that never leaves
# its module (gateway.acl's _ScanError and _Invalid are LocalErrors).
ALLOWED_OUTSIDE_THE_TREE: Final[dict[str, str]] = {}


def _modules(package: ModuleType) -> list[ModuleType]:
    names = [
        info.name
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
        # A __main__ runs a program when imported (gateway's starts the CLI) and
        # defines no classes.
        if info.name.rpartition(".")[2] != "__main__"
    ]
    return [package, *(importlib.import_module(name) for name in names)]


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in [*_modules(asbp), *_modules(gateway), *_modules(courses)]:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


EXCEPTIONS: Final = _exception_classes()


def test_the_walk_finds_the_errors() -> None:
    # Guards the walk itself: a walk that found nothing would pass the test below.
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"ProtocolError", "ConfigError", "AclConfigError", "EngineUnavailable"} <= names
    assert {"ServerError", "CredentialConfigError", "_ScanError", "_Invalid"} <= names
    assert {"CourseConfigError", "CourseRefusedError"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_exception_class_is_in_the_tree(cls: type[BaseException]) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in ALLOWED_OUTSIDE_THE_TREE:
        assert not issubclass(cls, AsbpError), f"{name} is in the tree now: drop it"
        return
    assert issubclass(cls, AsbpError), f"{name} is not an AsbpError"
    if cls.__module__.startswith(("gateway.", "courses.")):
        # courses/ is the broker's too (docs/architecture.md): its errors are the gateway's.
        assert issubclass(cls, GatewayError), f"{name} is not a GatewayError"


def test_the_gateway_drawing_names_every_gateway_error() -> None:
    drawing = gateway.errors.__doc__ or ""
    gateway_errors = [
        cls
        for cls in EXCEPTIONS
        if cls.__module__.startswith("gateway.") and not cls.__name__.startswith("_")
    ]
    assert gateway_errors
    for cls in gateway_errors:
        assert cls.__name__ in drawing, f"gateway/errors.py does not draw {cls.__name__}"


def test_the_asbp_drawing_names_every_asbp_error_and_the_gateway_branch() -> None:
    drawing = asbp.errors.__doc__ or ""
    for cls in EXCEPTIONS:
        if cls.__module__.startswith("asbp."):
            assert cls.__name__ in drawing, f"asbp/errors.py does not draw {cls.__name__}"
    assert "GatewayError" in drawing and "gateway/errors.py" in drawing


@pytest.mark.parametrize(
    ("cls", "second_base"),
    [
        (ConfigError, ValueError),
        (AclConfigError, ValueError),
        (CredentialConfigError, ValueError),
        (ServeConfigError, ValueError),
        (PatternError, ValueError),
        (ServerError, RuntimeError),
    ],
    ids=lambda value: value.__name__,
)
def test_local_errors_keep_their_old_base(
    cls: type[LocalError], second_base: type[Exception]
) -> None:
    assert issubclass(cls, LocalError) and issubclass(cls, second_base)


def test_a_local_error_prints_its_message_alone() -> None:
    with pytest.raises(UnsafePatternError) as info:
        compile_destination("/a/.*/b/.*/c")
    error = info.value
    # No "2001: " prefix: callers put this message inside their own.
    assert str(error) == error.message == error.args[0]
    assert not str(error).startswith(str(int(FaultCode.INVALID_DESTINATION_NAME)))
    assert error.code is FaultCode.INVALID_DESTINATION_NAME
    # A fault, by contrast, prints its code.
    assert str(GatewayError("down", code=FaultCode.ENGINE_UNAVAILABLE)) == "2005: down"


# gateway.auth.trust imports gateway.config.model, which runs gateway/config/__init__.py,
# which imports the loader: a cycle if the loader imported gateway.auth at module level.
# Each import runs in a fresh interpreter, because which module is imported first decides
# whether a cycle bites.
@pytest.mark.parametrize(
    "module",
    [
        "gateway.auth.trust",
        "gateway.auth.credentials",
        "gateway.broker_id",
        "gateway.config",
        "gateway.config.model",
        "gateway.config.checks",
        "gateway.config.loading",
        "gateway.config.rendering",
        "gateway.errors",
        "gateway.acl",
    ],
)
def test_importing_first_has_no_cycle(module: str) -> None:
    subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=ROOT,
        check=True,
        timeout=20 * T,
    )
