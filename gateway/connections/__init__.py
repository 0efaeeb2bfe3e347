"""Connections: the broker's side of Channels, Tubes and Subjects, and their outboxes."""

__all__: list[str] = []
