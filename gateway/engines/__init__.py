"""Topic and queue engines: ``memory`` (embedded) and ``redis`` (shared, durable)."""

__all__: list[str] = []
