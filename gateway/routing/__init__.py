"""Routing: where every Command goes (draft §2.4), the built-in Commands the broker
answers itself, Subject authentication, the in-flight books and splicing."""

__all__: list[str] = []
