"""ConfigError: a setting that is unknown, has the wrong type, or breaks a rule."""

from __future__ import annotations

from gateway.config.text import describe
from gateway.errors import LocalError

__all__ = ["ConfigError", "expected"]


# Also a ValueError: it was one before the error tree had it, and callers of
# load_config (scripts, tests, the broker_id helpers) may catch it that way.
class ConfigError(LocalError, ValueError):
    """A setting is unknown, has the wrong type, or breaks a rule.

    Raised at start-up and never sent to a peer, so it has no fault code of its own:
    ``asbp broker`` and ``asbp config`` print it and exit with status 2.

    Attributes:
        source: where the offending value came from (``broker.toml:port``, ``ASBP_PORT``,
            ``--port``, ``broker.toml:12``), or ``None`` when no single value is at fault.
        detail: what is wrong, without the source.
        key: the dotted setting or table at fault (``port``, ``tls.keyfile``,
            ``agents.billing.serves``), or ``None`` when it is not one key (an unknown
            ``ASBP_*`` variable, a file that cannot be read).
        line: the 1-based line in the TOML file, when the error was found at one.
    """

    def __init__(
        self,
        detail: str,
        *,
        source: str | None = None,
        key: str | None = None,
        line: int | None = None,
    ) -> None:
        self.source = source
        self.detail = detail
        self.key = key
        self.line = line
        super().__init__(detail if source is None else f"{source}: {detail}")


def expected(what: str, value: object, source: str, *, key: str | None = None) -> ConfigError:
    """The error for ``value`` that is not ``what`` (``"an integer"``)."""
    return ConfigError(f"expected {what}, got {describe(value)}", source=source, key=key)
