"""Access control: Sapo-Broker 3's security policies, as a pure module.

Who may READ (consume) or WRITE (produce) which topic, queue, virtual queue or,
our extension, Command-Name, decided by ordered PERMIT/DENY entries with
conditions on the peer's address, the Subject's roles and what the transport
channel guarantees. docs/acl.md is the reference; the parts:

- :mod:`~gateway.acl.conditions`: :class:`AccessContext` (who asks) and the
  conditions ADDRESS, ROLE, CHANNEL_TYPE, AND, ALWAYS.
- :mod:`~gateway.acl.patterns`: destination regexes, checked for runaway
  backtracking at load time.
- :mod:`~gateway.acl.entries`: :class:`AclEntry`, :class:`SecurityPolicy`,
  :class:`Decision` and the enums.
- :mod:`~gateway.acl.policy`: :class:`Acl`, which flattens inheritance once and
  evaluates first-match.
- :mod:`~gateway.acl.loader`: the ``[security]`` table of the broker's TOML config,
  with :mod:`~gateway.acl.toml_lines` to name the line of a bad entry.
- :mod:`~gateway.acl.errors`: :class:`AclConfigError` (start-up) and
  :class:`AccessDenied` (fault 3201).

Nothing here does I/O except :func:`load_acl` reading the file it is given.
"""

from __future__ import annotations

from gateway.acl.conditions import (
    AccessContext,
    Address,
    Always,
    And,
    ChannelProperty,
    ChannelType,
    Condition,
    Role,
    channel_properties,
)
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
from gateway.acl.loader import SECURITY_TABLE, acl_from_config, load_acl
from gateway.acl.patterns import PatternError, UnsafePatternError, compile_destination
from gateway.acl.policy import Acl

__all__ = [
    "DEFAULT_POLICY",
    "SECURITY_TABLE",
    "SYSTEM_ENTRY",
    "AccessContext",
    "AccessDenied",
    "Acl",
    "AclConfigError",
    "AclEntry",
    "Action",
    "Address",
    "Always",
    "And",
    "ChannelProperty",
    "ChannelType",
    "Condition",
    "Decision",
    "DestinationType",
    "PatternError",
    "Privilege",
    "Role",
    "SecurityPolicy",
    "UnsafePatternError",
    "acl_from_config",
    "channel_properties",
    "compile_destination",
    "load_acl",
]
