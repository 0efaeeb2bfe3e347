"""The embedded engine: topics, queues and virtual queues in this process's memory."""

__all__: list[str] = []
