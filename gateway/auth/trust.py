"""Which Command-Names each Application-Agent identity may serve.

Theory of operation
-------------------
A verified credential proves *who* an agent is (gateway.auth.credentials); this
module decides *what* that identity may serve, that is register for with
``asbp.register``. The issue it closes is §7.2's "Application-Agent spoofing":
a stolen or leaked agent key, or a misconfigured agent, must not be able to
register for Commands it was never meant to see, above all the
Authenticate-Command, which carries Subjects' credentials (§7.3.1).

Each ``[agents.<identity>]`` table may hold an allow-list::

    [agents.chat]
    public_key = "keys/chat.pem"
    serves = ['chat\\..*', 'auth.login']

Each entry is a regular expression that must match the whole Command-Name,
checked and compiled by :func:`gateway.acl.compile_destination` (patterns that
could backtrack without bound are refused at start-up, exactly as in ACL
entries). The rules, in :meth:`ServePolicy.allows`:

=====================  ==================================================
``serves`` given        a name is allowed when one entry matches it
``serves`` absent       any name is allowed
either way              the Authenticate-Command only when an entry *names*
                        it: the entry is the name itself (``auth.login``) or
                        the name with regex escapes (``auth\\.login``); an
                        entry that merely matches it (``auth\\..*``, ``.*``)
                        does not count
=====================  ==================================================

So a catch-all ``serves = ['.*']`` or a missing ``serves`` never hands
credentials to an agent by accident: an operator grants the
Authenticate-Command by writing its name down. An identity that is not
configured at all may serve nothing (fail closed; a Tube cannot have one).

Names under ``asbp.`` belong to the broker and are refused by the router
whatever this module says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from gateway.acl import PatternError, compile_destination
from gateway.config.model import GatewayConfig
from gateway.errors import LocalError

__all__ = ["SERVES_KEY", "AgentTrust", "ServeConfigError", "ServePolicy", "agent_trust"]

#: The key of ``[agents.<identity>]`` that holds the allow-list.
SERVES_KEY: Final = "serves"

# A backslash before a character that is not a letter or digit makes that
# character literal; this is all re.escape ever writes.
_LITERAL_ESCAPE: Final = re.compile(r"\\([^0-9A-Za-z])")


# Also a ValueError: it was one before the error tree had it, and callers of
# AgentTrust.from_agents_table may catch it that way.
class ServeConfigError(LocalError, ValueError):
    """An agent's ``serves`` allow-list cannot be loaded; the broker must not start.

    Raised at start-up and never sent to a peer, so it has no fault code of its own.

    Attributes:
        identity: the agent whose table is at fault.
        detail: what is wrong, without the identity.
    """

    def __init__(self, detail: str, *, identity: str) -> None:
        self.identity = identity
        self.detail = detail
        super().__init__(f"agent {identity!r}: {SERVES_KEY}: {detail}")


@dataclass(frozen=True, slots=True)
class ServePolicy:
    """What one Application-Agent identity may serve."""

    #: The compiled allow-list, in the order of the file; None when ``serves``
    #: is not configured.
    patterns: tuple[re.Pattern[str], ...] | None = None

    @classmethod
    def from_entries(cls, entries: object, *, identity: str) -> ServePolicy:
        """Check and compile a ``serves`` value from the config file.

        Args:
            entries: the value of ``serves``: a list of patterns (one string is
                read as a list of one).
            identity: the agent, for messages.

        Raises:
            ServeConfigError: not a list of strings, or a pattern that is empty,
                not a regular expression or unsafe; the message says which.
        """
        items = [entries] if isinstance(entries, str) else entries
        if not isinstance(items, list):
            raise ServeConfigError(
                f"must be a list of Command-Name patterns, not {type(entries).__name__}",
                identity=identity,
            )
        patterns: list[re.Pattern[str]] = []
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise ServeConfigError(
                    f"entry {index} must be a string, not {type(item).__name__}",
                    identity=identity,
                )
            try:
                patterns.append(compile_destination(item))
            except PatternError as exc:  # UnsafePatternError is one too
                raise ServeConfigError(f"{item!r}: {exc}", identity=identity) from exc
        return cls(tuple(patterns))

    def allows(self, name: str, *, authenticate_command: str | None = None) -> bool:
        """Whether the agent may register for ``name``.

        Args:
            name: the Command-Name it asks to serve.
            authenticate_command: the broker's Authenticate-Command, which is
                allowed only when an entry names it (see the module docstring).
        """
        if name == authenticate_command:
            return self.patterns is not None and any(
                _names(pattern.pattern, name) for pattern in self.patterns
            )
        if self.patterns is None:
            return True
        return any(pattern.fullmatch(name) for pattern in self.patterns)


def _names(entry: str, name: str) -> bool:
    """Whether ``entry`` is ``name`` written down, plainly or with regex escapes."""
    return entry == name or _LITERAL_ESCAPE.sub(r"\1", entry) == name


class AgentTrust:
    """Every configured identity's :class:`ServePolicy`; the router asks it.

    Args:
        policies: identity -> its policy.
        authenticate_command: the broker's Authenticate-Command, if any.
    """

    __slots__ = ("_policies", "authenticate_command")

    def __init__(
        self, policies: Mapping[str, ServePolicy], *, authenticate_command: str | None
    ) -> None:
        self._policies: Mapping[str, ServePolicy] = MappingProxyType(dict(policies))
        self.authenticate_command = authenticate_command

    @classmethod
    def from_agents_table(
        cls, agents: Mapping[str, Any], authenticate_command: str | None
    ) -> AgentTrust:
        """Build from the ``[agents]`` table of the config (``GatewayConfig.agents``).

        Only ``serves`` is read; the keys are gateway.auth.credentials' business.

        Raises:
            ServeConfigError: a bad ``serves``, naming the agent.
        """
        policies: dict[str, ServePolicy] = {}
        for identity, table in agents.items():
            if isinstance(table, Mapping) and SERVES_KEY in table:
                policies[identity] = ServePolicy.from_entries(table[SERVES_KEY], identity=identity)
            else:
                policies[identity] = ServePolicy()
        return cls(policies, authenticate_command=authenticate_command)

    @property
    def policies(self) -> Mapping[str, ServePolicy]:
        """Identity -> its policy, read-only."""
        return self._policies

    def may_serve(self, identity: str, name: str) -> bool:
        """Whether the agent ``identity`` may register for the Command-Name ``name``."""
        policy = self._policies.get(identity)
        if policy is None:
            return False
        return policy.allows(name, authenticate_command=self.authenticate_command)

    @property
    def authenticators(self) -> frozenset[str]:
        """The identities that may serve the Authenticate-Command (none without one)."""
        name = self.authenticate_command
        if name is None:
            return frozenset()
        return frozenset(
            identity
            for identity, policy in self._policies.items()
            if policy.allows(name, authenticate_command=name)
        )


def agent_trust(config: GatewayConfig) -> AgentTrust:
    """The :class:`AgentTrust` for ``config`` (already validated by gateway.config.loading).

    Raises:
        ServeConfigError: a bad ``serves``, for a config built without the settings.
    """
    return AgentTrust.from_agents_table(config.agents, config.authenticate_command)
