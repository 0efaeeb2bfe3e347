"""Tubes and Command-Respondents: the Application-Agent side of the broker.

§2.7: "Application-Agents MAY be created as a single program ... or as a
group of programs which share a Application-Agent-Identifier." Each
connection is a Tube; the Tubes that share a verified identity form one
Application-Agent. Respondents are registered per Tube, because each Tube
says what its own process serves, and a Tube that closes takes its
registrations with it.

Balancing: among the Tubes registered for a Command-Name, the broker picks
the one with the fewest Commands in flight; ties go to the Tube registered
longest, which keeps a quiet bus predictable in tests and logs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from asbp import ApplicationAgentId, FaultCode
from gateway.acl import AccessContext
from gateway.connections.flow import FlowGate
from gateway.connections.outboxes import Outbox

__all__ = ["RespondentTable", "Tube"]


@dataclass(eq=False, slots=True)
class Tube:
    """One Application-Agent connection."""

    #: The verified Application-Agent-Identifier ``a``: from the credential,
    #: never from a header.
    agent_id: ApplicationAgentId
    #: Where the router leaves Commands for the agent.
    outbox: Outbox
    #: The peer's address, for logs.
    remote: str = ""
    #: An identifier for logs and for the agent's own diagnostics.
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Who is behind the Tube, for access control.
    access: AccessContext = field(default_factory=AccessContext)
    #: Command-Names this Tube serves.
    serves: set[str] = field(default_factory=set)
    #: Commands forwarded to this Tube that await an answer.
    in_flight: int = 0
    #: Why the broker closed the Tube, if it did.
    fault: FaultCode | None = None
    #: Whether the Tube has been closed.
    closed: bool = False
    #: Whether it may be read from now (flow control: gateway.connections.flow).
    gate: FlowGate = field(default_factory=FlowGate)


class RespondentTable:
    """Which Tubes serve which Command-Names."""

    __slots__ = ("_by_name", "_tubes", "attached", "detached", "on_first", "on_last")

    def __init__(self) -> None:
        #: Tubes attached and detached since the broker started (the metrics'
        #: counters, which only go up).
        self.attached = 0
        self.detached = 0
        self._by_name: dict[str, list[Tube]] = {}
        self._tubes: dict[str, Tube] = {}
        #: Called when a Command-Name gains its first Tube here, and loses its last:
        #: the bus-wide directory learns what this broker serves (gateway.plane).
        self.on_first: Callable[[str], object] | None = None
        self.on_last: Callable[[str], object] | None = None

    def attach(self, tube: Tube) -> None:
        """Track a newly opened Tube (it serves nothing yet)."""
        self._tubes[tube.id] = tube
        self.attached += 1

    def detach(self, tube: Tube) -> None:
        """Forget a closed Tube and everything it served."""
        if self._tubes.pop(tube.id, None) is not None:
            self.detached += 1
        self.unregister(tube, list(tube.serves))

    def register(self, tube: Tube, names: Iterable[str]) -> None:
        """``tube`` serves ``names`` from now on."""
        for name in names:
            if name not in tube.serves:
                tube.serves.add(name)
                tubes = self._by_name.get(name)
                if tubes is None:
                    tubes = self._by_name[name] = []
                    if self.on_first is not None:
                        self.on_first(name)
                tubes.append(tube)

    def unregister(self, tube: Tube, names: Iterable[str]) -> None:
        """``tube`` no longer serves ``names``."""
        for name in names:
            if name in tube.serves:
                tube.serves.discard(name)
                tubes = self._by_name[name]
                tubes.remove(tube)
                if not tubes:
                    del self._by_name[name]
                    if self.on_last is not None:
                        self.on_last(name)

    def pick(
        self,
        name: str,
        *,
        exclude: Tube | None = None,
        among: Collection[ApplicationAgentId] | None = None,
    ) -> Tube | None:
        """The Tube with the fewest Commands in flight that serves ``name``.

        Args:
            exclude: a Tube not to pick (the sender's own).
            among: only Tubes of these Application-Agents (a Subject's).
        """
        tubes = self._by_name.get(name)
        if not tubes:
            return None
        best: Tube | None = None
        for tube in tubes:
            if (
                tube is not exclude
                and (among is None or tube.agent_id in among)
                and (best is None or tube.in_flight < best.in_flight)
            ):
                best = tube
        return best

    def one_per_agent(self, name: str) -> list[Tube]:
        """For each Application-Agent serving ``name``, its least busy Tube."""
        best: dict[ApplicationAgentId, Tube] = {}
        for tube in self._by_name.get(name, ()):
            current = best.get(tube.agent_id)
            if current is None or tube.in_flight < current.in_flight:
                best[tube.agent_id] = tube
        return list(best.values())

    def of_agents(self, agents: Collection[ApplicationAgentId]) -> list[Tube]:
        """Every open Tube of these Application-Agents."""
        return [tube for tube in self._tubes.values() if tube.agent_id in agents]

    def serves(self, name: str) -> bool:
        """Whether any Tube serves ``name``."""
        return name in self._by_name

    def names(self) -> list[str]:
        """Every Command-Name served right now."""
        return sorted(self._by_name)

    def load(self, name: str) -> int:
        """Commands in flight at the Tubes serving ``name``, each Tube counted once."""
        return sum(tube.in_flight for tube in self._by_name.get(name, ()))

    def get(self, tube_id: str) -> Tube | None:
        """The open Tube with this identifier, or None."""
        return self._tubes.get(tube_id)

    def tubes(self) -> list[Tube]:
        """Every open Tube."""
        return list(self._tubes.values())

    def agents(self) -> dict[ApplicationAgentId, list[Tube]]:
        """Open Tubes grouped by Application-Agent."""
        result: dict[ApplicationAgentId, list[Tube]] = {}
        for tube in self._tubes.values():
            result.setdefault(tube.agent_id, []).append(tube)
        return result
