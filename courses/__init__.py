"""Courses: links between brokers of different organisations' buses (docs/courses.md).

Commands addressed ``name*domain`` (``r``, ``p``, ``x``: the Conversation Protocol
profile we chose) reach Subjects on this bus or cross a Course to another::

    settings    the [courses] table            credential  the handshake's signatures
    wire        the keys that cross (pure)     service     addressing, accepting crossings
    link        one outbound Course and queue  endpoint    the answering side, /course
    seen        the crossings accepted (memory or Redis)
    transport   dialling: HTTP/2 or 1.1    h2          WebSocket over HTTP/2 (RFC 8441)

Built on the broker's parts (gateway.auth, gateway.engines); wired in by
gateway/app.py, the one gateway module that imports this package.
"""

__all__: list[str] = []
