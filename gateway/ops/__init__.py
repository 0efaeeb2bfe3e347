"""Running the broker: the ``asbp`` command, the ASGI servers, logging and the demo."""

__all__: list[str] = []
