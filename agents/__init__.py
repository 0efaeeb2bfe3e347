"""Application-Agent SDK and User-Agent client."""

__all__: list[str] = []
