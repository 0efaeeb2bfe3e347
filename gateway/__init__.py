"""The ASBP broker."""

__all__: list[str] = []
