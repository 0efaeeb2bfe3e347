"""The ``redis`` engine: durable queues and topics shared by many brokers."""

__all__: list[str] = []
