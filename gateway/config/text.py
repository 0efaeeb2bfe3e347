"""Values as text: in error messages, and as TOML that :func:`tomllib.loads` reads back.

Shared by the loader (whose messages quote values), the checks (which quote values and
name ``[agents]`` keys) and the renderer (which writes the effective configuration).
"""

from __future__ import annotations

import difflib
import re
import urllib.parse
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Final

import orjson

__all__ = ["describe", "mask_url", "or_list", "suggest", "toml_key", "toml_string", "toml_value"]

_BARE_KEY_RE: Final = re.compile(r"[A-Za-z0-9_-]+")


def describe(value: object) -> str:
    """``value`` as an error message names it: TOML's words for its types."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date | time):
        return f"the date/time {value.isoformat()}"
    return repr(value)


def or_list(items: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``."""
    quoted = [repr(item) for item in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def suggest(name: str, candidates: list[str]) -> str:
    """`` (did you mean port?)`` when ``name`` looks like a typo of a candidate, else ``""``."""
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {matches[0]}?)" if matches else ""


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    username = userinfo.partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{username}:***@{hostinfo}"))


def toml_key(key: str) -> str:
    """``key`` as a TOML key: bare when it can be, quoted otherwise."""
    return key if _BARE_KEY_RE.fullmatch(key) else toml_string(key)


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string."""
    # JSON's escapes are all valid in a TOML basic string; DEL is the one control
    # character JSON leaves alone and TOML does not allow.
    return orjson.dumps(text).decode().replace("\x7f", "\\u007f")


def toml_value(value: object) -> str:
    """``value`` as a TOML value (inline tables for mappings).

    Raises:
        TypeError: a value TOML has no form for.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return toml_string(str(value))
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")
