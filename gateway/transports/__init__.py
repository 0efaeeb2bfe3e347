"""Transports: thin shells that move frames between sockets and the router.

Each reads frames, hands them to ``Broker.router`` with where they came
from, and drains an outbox back to its peer. None of them decodes, routes or
checks anything the router does.
"""

__all__: list[str] = []
