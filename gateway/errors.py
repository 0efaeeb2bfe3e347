"""The gateway's branch of the one error tree (the root is :mod:`asbp.errors`).

::

    AsbpError                          asbp.errors; .code: FaultCode, .message: str
     └── GatewayError                  anything the gateway raises on purpose
          ├── AccessDenied       3201  gateway.acl.errors: a policy refused a request
          ├── CredentialRefused  3101  gateway.auth.errors: .reason .identity
          ├── EngineUnavailable  2005  gateway.engines.base: Redis cannot be reached
          │    └── PlaneUnavailable    gateway.plane.base: other brokers cannot be reached
          ├── QueueLimitReached  2003  gateway.engines.base: one queue too many
          │    └── QueueFull     2006  the queue holds max_queue_depth messages
          ├── InvalidVirtualQueue 2001 gateway.engines.topic_patterns: .name .pattern
          │                            (also a ValueError)
          ├── InvalidDestinationName 2001  gateway.messaging.requests
          ├── InvalidDestinationType 2002  gateway.messaging.requests
          ├── TooManySubscriptions   2004  gateway.messaging.subscribers
          ├── TooManyPending         2106  gateway.messaging.sequencing: a sender's queue
          │                                of engine calls is full
          ├── MessageTooLarge        1101  gateway.messaging.dispatch
          ├── TooManyChannels        2108  gateway.connections.addresses: .retry_after
          ├── Refused           2110, 2113  gateway.connections.resume: a resume that
          │                                cannot happen (sent, then the close)
          └── LocalError               never sent to a peer; str() is the message alone
               ├── ConfigError         gateway.config.errors: .source .detail .key .line
               ├── AclConfigError      gateway.acl.errors: .source .line .key .detail
               ├── CredentialConfigError  gateway.auth.errors: .identity .source .detail
               ├── ServeConfigError    gateway.auth.trust: .identity .detail
               ├── PatternError  2001  gateway.acl.patterns: not a regular expression
               │    └── UnsafePatternError  one that could match in unbounded time
               ├── ServerError         gateway.ops.server: cannot listen or start
               │                       (also a RuntimeError)
               ├── UnsupportedHypercorn  gateway.transports.hypercorn_ws: a Hypercorn
               │                       other than 0.18, whose stream it replaces
               ├── ApiError            gateway.api.declare: a management API answer
               │                       other than 2xx: .status .detail
               └── ApiRefused          gateway.ops.admin: the CLI got no answer, or
                                       an error, from the management API

The errors above a :class:`LocalError` are faults: the broker sends them to the peer
as an ``asbp.fault`` with their ``code``. A :class:`LocalError` goes to the code or
the operator that caused it: start-up stops with it (exit status 2 for the
configuration ones), or the caller wraps it in a fault of its own, as the messaging
layer wraps a :class:`PatternError` in ``InvalidDestinationName``.

Every ``LocalError`` above except ``ServerError``, ``UnsupportedHypercorn``,
``ApiError`` and ``ApiRefused`` is a ``ValueError``, and the first two are
``RuntimeError`` too: they were those before this tree had them, and callers
outside this repository (and tests) catch them that way.
"""

from __future__ import annotations

from asbp.errors import AsbpError

__all__ = ["GatewayError", "LocalError"]


class GatewayError(AsbpError):
    """The root of every error the gateway raises on purpose.

    ``except GatewayError`` catches the broker's errors and not the protocol core's
    (:class:`~asbp.errors.ProtocolError`); ``except AsbpError`` catches both.
    """


class LocalError(GatewayError):
    """An error for the code or operator that caused it, never sent to a peer as is.

    Configuration, key, ACL-file and listening errors stop the broker before it serves
    anyone; a :class:`~gateway.acl.PatternError` is turned by its caller into a fault
    of the caller's choosing. So ``str()`` is the message alone, as an operator reads
    it, without the ``"<code>: "`` prefix of a fault.

    Attributes:
        code: the fault a caller would report for it, where one applies
            (``PatternError``: 2001); otherwise :class:`~asbp.errors.AsbpError`'s
            default, which nothing reports.
    """

    def __str__(self) -> str:
        return self.message
