"""The access-control lists, as the messaging built-ins ask them (Sapo 3201).

A publication needs WRITE on its destination; a subscription, a poll and an
acknowledgement need READ. A topic *pattern* is not a name the policy could
judge, so a pattern subscription is let through here and each topic delivered
through it is checked instead (:meth:`AclGate.may_read`), as Sapo checks the
delivered name rather than the pattern's text. Queue consumers ask the same
question of every virtual-queue message they hand out.
"""

from __future__ import annotations

import logging

from asbp import AsbpError, FaultCode
from gateway.acl import AccessContext, Acl, DestinationType, Privilege
from gateway.messaging.requests import Destination

__all__ = ["AclGate"]


class AclGate:
    """Asks the ACL (if any is on) whether a sender may use a destination.

    Args:
        acl: the broker's policy; None, or one that is not enabled, allows all.
        log: where refusals are logged (``acl.denied``).
    """

    __slots__ = ("_acl", "_log")

    def __init__(self, acl: Acl | None, *, log: logging.Logger) -> None:
        self._acl = acl if acl is not None and acl.enabled else None
        self._log = log

    def replace(self, acl: Acl) -> None:
        """Check with ``acl`` from now on (an operator reloaded the file)."""
        self._acl = acl if acl.enabled else None

    def require(
        self, access: AccessContext, destination: Destination, privilege: Privilege
    ) -> None:
        """Return if ``access`` holds ``privilege`` on ``destination``.

        Raises:
            AsbpError: 3201, denied (and logged).
        """
        acl = self._acl
        if acl is None:
            return
        decision = acl.check(access, destination.type, destination.name, privilege)
        if not decision.allowed:
            self._log.warning(
                "acl.denied",
                extra={
                    "who": access.channel_id,
                    "type": destination.type.value,
                    "destination": destination.name,
                    "privilege": privilege.value,
                    "reason": acl.describe(decision),
                },
            )
            verb = "publishing to" if privilege is Privilege.WRITE else "consuming from"
            raise AsbpError(
                f"{verb} {destination.type.value} {destination.name!r} is denied",
                code=FaultCode.ACCESS_DENIED,
            )

    def may_read(self, access: AccessContext, topic: str) -> bool:
        """Whether ``access`` may read a message of ``topic`` (pattern subscriptions,
        virtual queues)."""
        acl = self._acl
        return (
            acl is None or acl.check(access, DestinationType.TOPIC, topic, Privilege.READ).allowed
        )
