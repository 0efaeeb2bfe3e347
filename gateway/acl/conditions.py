"""Who is asking (:class:`AccessContext`) and the conditions an ACL entry tests.

Sapo-Broker 3, "Access control": "Conditions represent a binary evaluation result
which determines the application of the related ACL entry. They can be of the
following types: ADDRESS, ROLE, CHANNEL_TYPE, AND, ALWAYS." Each is a frozen
value here with one method, ``matches(context) -> bool``, called on every check,
so each does its parsing once, at construction, and only integer and set
operations per call.

Addresses are compared in one family: an IPv4-mapped IPv6 peer
(``::ffff:10.1.2.3``, what a dual-stack socket reports for an IPv4 client) is
taken as the IPv4 address it carries, and an IPv6 network inside
``::ffff:0:0/96`` as the IPv4 network it maps. So ``10.0.0.0/8`` matches that
peer whichever way the socket was bound. A peer whose address is unknown
(``address=None``) matches no ``Address`` condition.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

__all__ = [
    "AccessContext",
    "Address",
    "Always",
    "And",
    "ChannelProperty",
    "ChannelType",
    "Condition",
    "Role",
    "channel_properties",
]

_IPV4_MAPPED: Final = ipaddress.IPv6Network("::ffff:0:0/96")

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


class ChannelProperty(enum.Enum):
    """A security property the transport channel guarantees (Sapo's CHANNEL_TYPE)."""

    #: Nobody on the path can read the traffic (TLS).
    CONFIDENTIALITY = "CONFIDENTIALITY"
    #: Nobody on the path can alter the traffic undetected (TLS).
    INTEGRITY = "INTEGRITY"
    #: The channel itself authenticated the peer: TLS with a client certificate
    #: the server verified. A bearer credential sent over the channel is not this.
    AUTHENTICITY = "AUTHENTICITY"


#: No properties: one shared value (``frozenset()`` makes a new one each time, a
#: fifth of a KiB for every Channel in the clear).
_NONE: Final[frozenset[ChannelProperty]] = frozenset()


def channel_properties(
    *, tls: bool, verified_client_certificate: bool = False
) -> frozenset[ChannelProperty]:
    """The properties a transport channel guarantees.

    Args:
        tls: the peer connected over TLS (``https``/``wss``).
        verified_client_certificate: the peer presented a client certificate that
            the TLS server verified.

    Raises:
        ValueError: a verified client certificate without TLS.
    """
    if not tls:
        if verified_client_certificate:
            raise ValueError("a client certificate cannot be verified without TLS")
        return _NONE
    if verified_client_certificate:
        return frozenset(ChannelProperty)
    return frozenset({ChannelProperty.CONFIDENTIALITY, ChannelProperty.INTEGRITY})


def _peer(address: str) -> tuple[int, int]:
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return 4, int(parsed.ipv4_mapped)
    return parsed.version, int(parsed)


@dataclass(frozen=True, slots=True)
class AccessContext:
    """Everything the ACL knows about the principal behind a request.

    Built once per Channel or Tube (not per request) by the transport that
    accepted it, and passed to every :meth:`~gateway.acl.Acl.check`.

    Raises:
        ValueError: ``address`` is neither ``None``, ``""`` nor an IP address.
        TypeError: ``roles`` or ``channel_properties`` is not a frozenset of the
            right items.
    """

    #: The peer's IP address without port or brackets (``"10.1.2.3"``, ``"::1"``),
    #: or ``None``/``""`` when the transport does not know it.
    address: str | None = None
    #: The roles of the authenticated Subject (empty when there is none).
    roles: frozenset[str] = frozenset()
    #: What the transport channel guarantees; see :func:`channel_properties`.
    channel_properties: frozenset[ChannelProperty] = frozenset()
    #: The verified Application-Agent-Identifier, for a Tube; picks its policy.
    agent_id: str | None = None
    #: The Subject-Identifier, for logs.
    subject_id: str | None = None
    #: The Channel- or Tube-Identifier, for logs.
    channel_id: str | None = None
    # (version, integer) of the address, normalised once for Address.matches.
    _peer: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.roles, frozenset) or not all(
            isinstance(role, str) for role in self.roles
        ):
            raise TypeError("roles must be a frozenset of str")
        if not isinstance(self.channel_properties, frozenset) or not all(
            isinstance(item, ChannelProperty) for item in self.channel_properties
        ):
            raise TypeError("channel_properties must be a frozenset of ChannelProperty")
        if self.address:
            try:
                peer = _peer(self.address)
            except ValueError:
                raise ValueError(
                    f"address must be an IP address without port, got {self.address!r}"
                ) from None
            object.__setattr__(self, "_peer", peer)


@dataclass(frozen=True, slots=True)
class Address:
    """ADDRESS: the peer's IP address is inside ``network`` (IPv4 or IPv6 CIDR)."""

    network: Network
    _version: int = field(init=False, repr=False, compare=False)
    _bits: int = field(init=False, repr=False, compare=False)
    _mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        network = self.network
        if not isinstance(network, ipaddress.IPv4Network | ipaddress.IPv6Network):
            raise TypeError("network must be an IPv4Network or IPv6Network; see Address.parse")
        if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_IPV4_MAPPED):
            prefix = network.prefixlen - 96
            network = ipaddress.IPv4Network((int(network.network_address) & 0xFFFFFFFF, prefix))
        object.__setattr__(self, "_version", network.version)
        object.__setattr__(self, "_bits", int(network.network_address))
        object.__setattr__(self, "_mask", int(network.netmask))

    @classmethod
    def parse(cls, cidr: str) -> Address:
        """An ``Address`` from ``"10.11.12.0/24"``, ``"2001:db8::/32"`` or one address.

        Raises:
            ValueError: not a network, or host bits are set (``10.11.12.5/24``),
                which is almost always a typo for a narrower or wider mask.
        """
        try:
            return cls(ipaddress.ip_network(cidr, strict=True))
        except ValueError as exc:
            raise ValueError(f"not an IP network in CIDR notation: {exc}") from None

    def matches(self, context: AccessContext) -> bool:
        """Whether the peer's address is inside the network."""
        peer = context._peer
        return peer is not None and peer[0] == self._version and peer[1] & self._mask == self._bits


@dataclass(frozen=True, slots=True)
class Role:
    """ROLE: the Subject's roles include ``name``."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a role must be a non-empty string")

    def matches(self, context: AccessContext) -> bool:
        """Whether the Subject has the role."""
        return self.name in context.roles


@dataclass(frozen=True, slots=True)
class ChannelType:
    """CHANNEL_TYPE: the channel guarantees every property in ``required``."""

    required: frozenset[ChannelProperty]

    def __post_init__(self) -> None:
        if (
            not isinstance(self.required, frozenset)
            or not self.required
            or not all(isinstance(item, ChannelProperty) for item in self.required)
        ):
            raise ValueError("a channel type needs a non-empty frozenset of ChannelProperty")

    def matches(self, context: AccessContext) -> bool:
        """Whether the channel guarantees all the required properties."""
        return self.required <= context.channel_properties


@dataclass(frozen=True, slots=True)
class And:
    """AND: every one of ``conditions`` matches."""

    conditions: tuple[Condition, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.conditions, tuple) or not self.conditions:
            # An empty AND would be vacuously true: an ALWAYS in disguise.
            raise ValueError("an AND needs at least one condition (use Always for none)")
        for condition in self.conditions:
            if not isinstance(condition, _CONDITION_TYPES):
                raise TypeError(f"not a condition: {condition!r}")

    @classmethod
    def of(cls, conditions: Iterable[Condition]) -> And:
        """An ``And`` from any iterable of conditions."""
        return cls(tuple(conditions))

    def matches(self, context: AccessContext) -> bool:
        """Whether all the conditions match (stopping at the first that does not)."""
        return all(condition.matches(context) for condition in self.conditions)


@dataclass(frozen=True, slots=True)
class Always:
    """ALWAYS: the entry applies to every request."""

    def matches(self, context: AccessContext) -> bool:
        """True."""
        return True


#: Any condition an ACL entry may carry.
Condition: TypeAlias = Address | Role | ChannelType | And | Always

_CONDITION_TYPES: Final = (Address, Role, ChannelType, And, Always)
