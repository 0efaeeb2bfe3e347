"""Broker configuration: the model (one frozen dataclass per concern) and loading
it from TOML, ``ASBP_*`` and flags."""

__all__: list[str] = []
