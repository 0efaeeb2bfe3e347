"""Courses: links between brokers of different organisations' buses."""

__all__: list[str] = []
