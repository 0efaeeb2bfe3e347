"""ACL entries and security policies: the values a policy file turns into.

Sapo-Broker 3, "Access control": "A security policy is composed by an Access
Control List (ACL), which is composed by entries. Each entry has an action
(PERMIT or DENY), a destination type (TOPIC, QUEUE or VIRTUAL_QUEUE), a
destination (such as "/topic/foo" or a regular expression) and a privilege (READ
or WRITE). Destination types and privileges may be declared as lists." We add one
destination type, :attr:`DestinationType.COMMAND`, so the same entries govern
which Command-Names a principal may send (WRITE) or serve (READ).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from gateway.acl.conditions import AccessContext, Always, Condition
from gateway.acl.patterns import FLAGS, compile_destination

__all__ = [
    "DEFAULT_POLICY",
    "SYSTEM_ENTRY",
    "AclEntry",
    "Action",
    "Decision",
    "DestinationType",
    "Privilege",
    "SecurityPolicy",
]

#: The policy every principal without a policy of its own uses (Sapo's name).
DEFAULT_POLICY: Final = "default"


class Action(enum.Enum):
    """What an entry does when it applies."""

    #: Allow the request.
    PERMIT = "PERMIT"
    #: Refuse the request with fault 3201.
    DENY = "DENY"


class DestinationType(enum.Enum):
    """What kind of destination a request names."""

    #: A topic: every subscriber gets each message.
    TOPIC = "TOPIC"
    #: A queue: each message goes to one consumer.
    QUEUE = "QUEUE"
    #: A virtual queue: a queue fed by a topic (Sapo's older name: TOPIC_AS_QUEUE).
    VIRTUAL_QUEUE = "VIRTUAL_QUEUE"
    #: Extension: a Command-Name. WRITE is sending a Command with that ``c``;
    #: READ is serving it (registering as its Respondent).
    COMMAND = "COMMAND"
    #: Extension: a peer bus's domain (docs/courses.md). WRITE is sending a Command
    #: addressed by ``r`` over the Course that reaches it; READ is unused.
    COURSE = "COURSE"


class Privilege(enum.Enum):
    """What a request does to its destination."""

    #: Consume: subscribe to a topic, take from a queue, serve a Command-Name.
    READ = "READ"
    #: Produce: publish to a topic or queue, send a Command with a Command-Name.
    WRITE = "WRITE"


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One line of an ACL: if the request is of one of ``destination_types``, for
    one of ``privileges``, its destination fully matches ``destination`` and
    ``condition`` holds, then ``action`` decides it.

    Raises:
        ValueError: no destination type or no privilege, or a ``destination`` not
            compiled by :func:`~gateway.acl.patterns.compile_destination` (so not
            checked for runaway backtracking).
    """

    action: Action
    destination_types: frozenset[DestinationType]
    #: Matched with ``fullmatch``: ``/topic/foo`` names exactly that destination.
    destination: re.Pattern[str]
    privileges: frozenset[Privilege]
    condition: Condition
    #: Where the entry was declared (a line of the policy file), for messages.
    line: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.destination_types:
            raise ValueError("an ACL entry needs at least one destination type")
        if not self.privileges:
            raise ValueError("an ACL entry needs at least one privilege")
        checked = compile_destination(self.destination.pattern)
        if self.destination.flags != checked.flags:
            raise ValueError(
                "compile destination patterns with compile_destination() "
                f"(flags {FLAGS!r}, checked for runaway backtracking)"
            )

    @classmethod
    def of(
        cls,
        action: Action,
        destination_types: DestinationType | Iterable[DestinationType],
        destination: str,
        privileges: Privilege | Iterable[Privilege],
        condition: Condition | None = None,
        *,
        line: int | None = None,
    ) -> AclEntry:
        """Build an entry from plain values; ``condition`` defaults to :class:`Always`.

        Raises:
            PatternError: ``destination`` is not a valid or safe pattern.
            ValueError: as for the constructor.
        """
        if isinstance(destination_types, DestinationType):
            destination_types = (destination_types,)
        if isinstance(privileges, Privilege):
            privileges = (privileges,)
        return cls(
            action,
            frozenset(destination_types),
            compile_destination(destination),
            frozenset(privileges),
            Always() if condition is None else condition,
            line=line,
        )

    def applies(
        self,
        context: AccessContext,
        destination_type: DestinationType,
        destination: str,
        privilege: Privilege,
    ) -> bool:
        """Whether this entry decides the request (whatever its action)."""
        return (
            destination_type in self.destination_types
            and privilege in self.privileges
            and self.condition.matches(context)
            and self.destination.fullmatch(destination) is not None
        )


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """A named ACL that may inherit another policy's entries.

    Raises:
        ValueError: an empty name.
    """

    name: str
    #: This policy's own entries, in declaration order.
    entries: tuple[AclEntry, ...] = ()
    #: The policy this one inherits from (``inherits`` in the file), if any.
    parent: str | None = None
    #: What a request no entry matches gets; ``None`` takes the parent's, and a
    #: policy without parent then gets :attr:`Action.PERMIT` (see docs/acl.md).
    default_action: Action | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a security policy needs a name")


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one access check."""

    #: Whether the request may go ahead.
    allowed: bool
    #: The policy that decided, or ``None`` when no security policy is configured.
    policy: str | None
    #: The index in that policy's entry stack (:meth:`Acl.stack`) of the entry that
    #: decided, or ``None`` when none applied and the policy's default action did.
    entry_index: int | None


#: Appended to every policy's entry stack, below all configured entries: the
#: broker publishes its own state under ``/system/`` (bypassing ACLs), so no
#: client may write there unless a policy explicitly PERMITs it above this entry.
SYSTEM_ENTRY: Final = AclEntry.of(
    Action.DENY,
    (DestinationType.TOPIC, DestinationType.QUEUE, DestinationType.VIRTUAL_QUEUE),
    "/system/.*",
    Privilege.WRITE,
)
