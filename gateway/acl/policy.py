"""The Acl: security policies flattened once, then evaluated on every request.

Theory of operation
-------------------
Sapo-Broker 3, "Access control evaluation criteria": "In the case of policy
inheritance, eventually with multiple degrees, a stack of entries is built with
the most specific ACLs at the top and entries inserted by declaration order
within each ACL. [...] evaluating a client request against the full access
control is sequential evaluation of entries. The first entry [which] results in a
positive evaluation is applied."

So for ``vip`` inheriting ``default``, the stack is::

    0  vip entry 0            most specific first
    1  vip entry 1
    2  default entry 0        then the parent's, in declaration order
    3  default entry 1
    4  SYSTEM_ENTRY           DENY WRITE /system/.*, under every stack
    -  default action         no entry applied: PERMIT unless configured

Construction resolves each policy's inheritance chain once (refusing unknown
parents and cycles), builds its stack, and then splits the stack by
``(destination type, privilege)``: a check only walks the entries that could
apply, in the same relative order, so first-match is preserved. The Decision
each entry would return is built up front. A check is therefore one dict lookup
to pick the policy, one to pick the rows, then per row a ``fullmatch`` and, if
it matched, a condition call (none for ALWAYS): linear in the entries, with
nothing cached from one request to the next.

Which policy a principal uses: an Application-Agent named in ``agents`` uses
that policy; otherwise the first role in ``roles`` (in declaration order) that
the Subject holds picks it; otherwise ``"default"``. A ``"default"`` policy is
implied, with no entries of its own, when none is declared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gateway.acl.conditions import AccessContext, Always
from gateway.acl.entries import (
    DEFAULT_POLICY,
    SYSTEM_ENTRY,
    AclEntry,
    Action,
    Decision,
    DestinationType,
    Privilege,
    SecurityPolicy,
)
from gateway.acl.errors import AccessDenied, AclConfigError

__all__ = ["Acl"]

_ALLOW_ALL: Final = Decision(allowed=True, policy=None, entry_index=None)
#: Who declared the built-in entry, in :meth:`Acl.describe`.
_BUILT_IN: Final = "built-in"

# (destination.fullmatch, condition.matches or None for Always, the Decision if both hold)
_Row = tuple[Callable[[str], object], Callable[[AccessContext], bool] | None, Decision]


@dataclass(frozen=True, slots=True)
class _Compiled:
    name: str
    stack: tuple[AclEntry, ...]
    #: For each stack entry, the policy that declared it.
    declared_by: tuple[str, ...]
    rows: Mapping[tuple[DestinationType, Privilege], tuple[_Row, ...]]
    otherwise: Decision


class Acl:
    """Access control for one broker: policies plus who uses which.

    Args:
        policies: the security policies, in declaration order. Names must be
            unique; ``"default"`` is implied when absent.
        agents: Application-Agent-Identifier → the policy that agent uses.
        roles: Subject role → policy; the first role, in this mapping's order,
            that a Subject holds picks its policy.
        source: where the policies came from (a file name), for messages.

    Raises:
        AclConfigError: a duplicate policy name, a parent that does not exist, an
            inheritance cycle, or an agent or role assigned to an unknown policy.
            ``key`` says which (``("policies", name, "inherits")``, ``("agents",
            id)``, ``("roles", role)``).
    """

    __slots__ = (
        "_agent_names",
        "_agents",
        "_default",
        "_enabled",
        "_policies",
        "_role_names",
        "_roles",
        "_source",
    )

    def __init__(
        self,
        policies: Iterable[SecurityPolicy] = (),
        *,
        agents: Mapping[str, str] | None = None,
        roles: Mapping[str, str] | None = None,
        source: str | None = None,
    ) -> None:
        declared: dict[str, SecurityPolicy] = {}
        for policy in policies:
            if policy.name in declared:
                raise AclConfigError(
                    f"policy {policy.name!r} is declared twice", key=("policies", policy.name)
                )
            declared[policy.name] = policy
        declared.setdefault(DEFAULT_POLICY, SecurityPolicy(DEFAULT_POLICY))
        compiled = _compile(declared)
        self._policies: Mapping[str, _Compiled] = MappingProxyType(compiled)
        self._default = compiled[DEFAULT_POLICY]
        self._agents = {
            agent: _assigned(compiled, policy, "agent", agent)
            for agent, policy in (agents or {}).items()
        }
        self._roles = tuple(
            (role, _assigned(compiled, policy, "role", role))
            for role, policy in (roles or {}).items()
        )
        self._enabled = True
        self._agent_names: Mapping[str, str] = MappingProxyType(dict(agents or {}))
        self._role_names: Mapping[str, str] = MappingProxyType(dict(roles or {}))
        self._source = source

    @classmethod
    def allow_all(cls) -> Acl:
        """The Acl of a broker with no security policies: every request is allowed.

        Sapo-Broker 3: "Every agent [has] an associated security policy, except in
        the case of security policy absence in [which] it defaults to 'allow
        everything'." Note that this leaves ``/system/`` writable too; configure
        an empty ``[security]`` table to get only the built-in ``/system/`` entry.
        """
        acl = cls()
        acl._enabled = False
        return acl

    @property
    def enabled(self) -> bool:
        """False only for :meth:`allow_all`: no security policy is configured."""
        return self._enabled

    @property
    def source(self) -> str | None:
        """Where the policies came from (a file name), if known."""
        return self._source

    @property
    def agents(self) -> Mapping[str, str]:
        """Application-Agent-Identifier -> policy name, as configured.

        A broker can check these identities against its credentials config: an
        identity misspelt here would silently fall back to ``"default"``.
        """
        return self._agent_names

    @property
    def roles(self) -> Mapping[str, str]:
        """Subject role -> policy name, in the order that decides."""
        return self._role_names

    # -- introspection -------------------------------------------------------

    @property
    def policy_names(self) -> tuple[str, ...]:
        """Every policy, in declaration order (an implied ``"default"`` last)."""
        return tuple(self._policies)

    def stack(self, policy: str) -> tuple[AclEntry, ...]:
        """The flattened entry stack of ``policy``, in evaluation order.

        Raises:
            KeyError: no such policy.
        """
        return self._policies[policy].stack

    def default_action(self, policy: str) -> Action:
        """What ``policy`` does with a request no entry applies to.

        Raises:
            KeyError: no such policy.
        """
        return Action.PERMIT if self._policies[policy].otherwise.allowed else Action.DENY

    def policy_for(self, context: AccessContext) -> str | None:
        """The name of the policy ``context`` is checked against (None: ACLs off)."""
        return self._select(context).name if self.enabled else None

    def describe(self, decision: Decision) -> str:
        """Say, for a log line, why ``decision`` came out as it did.

        This names the policy and entry, so it is for operators, never for peers.
        """
        outcome = "allowed" if decision.allowed else "denied"
        if decision.policy is None:
            return f"{outcome}: no security policy is configured"
        compiled = self._policies[decision.policy]
        if decision.entry_index is None:
            return f"{outcome} by policy {decision.policy!r}: no entry applies (default action)"
        entry = compiled.stack[decision.entry_index]
        declared_by = compiled.declared_by[decision.entry_index]
        if declared_by == _BUILT_IN:
            where = "the built-in /system/ entry"
        else:
            where = f"an entry of policy {declared_by!r}"
            if entry.line is not None:
                where += f" at {self.source or 'line'}:{entry.line}"
        return (
            f"{outcome} by policy {decision.policy!r}, stack entry {decision.entry_index} "
            f"({where}): {entry.action.value} {entry.destination.pattern!r}"
        )

    # -- evaluation ----------------------------------------------------------

    def check(
        self,
        context: AccessContext,
        destination_type: DestinationType,
        destination: str,
        privilege: Privilege,
    ) -> Decision:
        """Decide whether ``context`` may exercise ``privilege`` on ``destination``.

        Args:
            context: who is asking, built once per Channel or Tube.
            destination_type: TOPIC, QUEUE, VIRTUAL_QUEUE, or COMMAND for a
                Command-Name.
            destination: the destination name or Command-Name, exactly as it will
                be routed (no normalisation happens here).
            privilege: READ (consume, serve) or WRITE (produce, send).
        """
        if not self.enabled:
            return _ALLOW_ALL
        policy = self._select(context)
        for fullmatch, matches, decision in policy.rows[destination_type, privilege]:
            # The pattern first: a C call, and usually what rules an entry out.
            if fullmatch(destination) is not None and (matches is None or matches(context)):
                return decision
        return policy.otherwise

    def require(
        self,
        context: AccessContext,
        destination_type: DestinationType,
        destination: str,
        privilege: Privilege,
    ) -> Decision:
        """Like :meth:`check`, but a refusal raises.

        Raises:
            AccessDenied: the policy refuses the request (fault 3201).
        """
        decision = self.check(context, destination_type, destination, privilege)
        if not decision.allowed:
            raise AccessDenied(destination_type, destination, privilege, decision)
        return decision

    def _select(self, context: AccessContext) -> _Compiled:
        if context.agent_id is not None:
            assigned = self._agents.get(context.agent_id)
            if assigned is not None:
                return assigned
        if context.roles:
            for role, assigned in self._roles:
                if role in context.roles:
                    return assigned
        return self._default


def _assigned(compiled: Mapping[str, _Compiled], policy: str, what: str, name: str) -> _Compiled:
    key = (f"{what}s", name)
    if not name:
        raise AclConfigError(f"an empty {what} name cannot be assigned a policy", key=key)
    found = compiled.get(policy)
    if found is None:
        known = ", ".join(repr(known_name) for known_name in compiled)
        raise AclConfigError(
            f"{what} {name!r} is assigned unknown policy {policy!r} (known: {known})", key=key
        )
    return found


def _chain(declared: Mapping[str, SecurityPolicy], name: str) -> list[str]:
    """``name`` and its ancestors, most specific first."""
    chain: list[str] = []
    position: dict[str, int] = {}
    current: str | None = name
    while current is not None:
        if current in position:
            cycle = [*chain[position[current] :], current]
            order = list(declared)
            # Blame the member declared first, so the error does not depend on
            # which policy the walk started from.
            culprit = min(cycle, key=order.index)
            raise AclConfigError(
                f"policy {culprit!r} is part of an inheritance cycle: {' -> '.join(cycle)}",
                key=("policies", culprit, "inherits"),
            )
        position[current] = len(chain)
        chain.append(current)
        parent = declared[current].parent
        if parent is not None and parent not in declared:
            raise AclConfigError(
                f"policy {current!r} inherits from unknown policy {parent!r}",
                key=("policies", current, "inherits"),
            )
        current = parent
    return chain


def _compile(declared: Mapping[str, SecurityPolicy]) -> dict[str, _Compiled]:
    compiled: dict[str, _Compiled] = {}
    for name in declared:
        chain = _chain(declared, name)
        stack: list[AclEntry] = []
        declared_by: list[str] = []
        for ancestor in chain:
            stack.extend(declared[ancestor].entries)
            declared_by.extend(ancestor for _ in declared[ancestor].entries)
        stack.append(SYSTEM_ENTRY)
        declared_by.append(_BUILT_IN)
        default_action = next(
            (
                declared[ancestor].default_action
                for ancestor in chain
                if declared[ancestor].default_action is not None
            ),
            Action.PERMIT,
        )
        decisions = [
            Decision(allowed=entry.action is Action.PERMIT, policy=name, entry_index=index)
            for index, entry in enumerate(stack)
        ]
        rows = {
            (destination_type, privilege): tuple(
                (
                    entry.destination.fullmatch,
                    None if isinstance(entry.condition, Always) else entry.condition.matches,
                    decisions[index],
                )
                for index, entry in enumerate(stack)
                if destination_type in entry.destination_types and privilege in entry.privileges
            )
            for destination_type in DestinationType
            for privilege in Privilege
        }
        compiled[name] = _Compiled(
            name=name,
            stack=tuple(stack),
            declared_by=tuple(declared_by),
            rows=rows,
            otherwise=Decision(
                allowed=default_action is Action.PERMIT, policy=name, entry_index=None
            ),
        )
    return compiled
