"""The two ways access control fails: a bad policy file, and a refused request.

::

    GatewayError                 (gateway.errors, under asbp.errors.AsbpError)
     ├── AccessDenied     3201   a request a policy refused; sent to the peer
     └── LocalError
          └── AclConfigError     start-up: a policy file or Acl that cannot be built
"""

from __future__ import annotations

from typing import Final

from asbp.faults import FaultCode
from gateway.acl.entries import Decision, DestinationType, Privilege
from gateway.errors import GatewayError, LocalError

__all__ = ["AccessDenied", "AclConfigError"]

# A destination is the client's own text; this much of it is enough to recognise it.
_MAX_ECHO: Final = 200


# Also a ValueError: it was one before the error tree had it, and callers of
# acl_from_config and load_acl may catch it that way.
class AclConfigError(LocalError, ValueError):
    """The security policies cannot be loaded; the broker must not start.

    Raised at start-up and never sent to a peer, so it has no fault code of its own.

    Attributes:
        detail: what is wrong, naming the policy and entry.
        source: the file (or other source) the policies came from, if known.
        line: the 1-based line of the offending entry or key, if known.
        key: where in the ``[security]`` table the fault is, as a key path
            (``("policies", "vip", "inherits")``), if it is tied to one key.
    """

    def __init__(
        self,
        detail: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: tuple[str | int, ...] | None = None,
    ) -> None:
        self.detail = detail
        self.source = source
        self.line = line
        self.key = key
        where = ":".join(str(part) for part in (source, line) if part is not None)
        super().__init__(f"{where}: {detail}" if where else detail)


class AccessDenied(GatewayError):
    """A security policy refused the request (fault 3201, Sapo's "Access denied").

    The message names the destination and the privilege, which the peer already
    knows, and nothing about the policy: which entry refused is for the logs
    (:meth:`Acl.describe <gateway.acl.Acl.describe>` on ``decision``).

    Attributes:
        destination_type: what kind of destination was refused.
        destination: the destination (or Command-Name) as requested.
        privilege: READ or WRITE.
        decision: the decision that refused it.
    """

    code = FaultCode.ACCESS_DENIED

    def __init__(
        self,
        destination_type: DestinationType,
        destination: str,
        privilege: Privilege,
        decision: Decision,
    ) -> None:
        self.destination_type = destination_type
        self.destination = destination
        self.privilege = privilege
        self.decision = decision
        shown = destination if len(destination) <= _MAX_ECHO else destination[:_MAX_ECHO] + "..."
        super().__init__(
            f"{privilege.value} access to {destination_type.value} {shown!r} is denied"
        )
