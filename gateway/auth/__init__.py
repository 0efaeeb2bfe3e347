"""Who an Application-Agent is: credentials, their keys and replay cache, which
Command-Names each identity may serve, and handshake throttling."""

__all__: list[str] = []
