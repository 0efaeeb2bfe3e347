"""Broker configuration: what can be configured, and loading it from TOML, ``ASBP_*`` and flags.

::

    loading.py    load_config and add_arguments: defaults < file < environment < flags
    rendering.py  the effective config as data or TOML, and docs/configuration.md
    checks.py     the rules of one value and the rules across values
    errors.py     ConfigError (a gateway.errors.LocalError, so an asbp.AsbpError)
    fields.py     every setting described once from the model: key, kind, env, flag
    model.py      the frozen dataclasses (GatewayConfig and one per table), field docs
    text.py       values as text, in messages and in TOML

Each module imports only modules below it in this list. ``checks`` imports
:mod:`gateway.auth` inside its functions, because :mod:`gateway.auth.trust` imports
:mod:`gateway.config.model`, which runs this file first.
``python -m gateway.config > docs/configuration.md`` regenerates the reference.

The list of every setting, :func:`gateway.config.fields.settings`, is not re-exported
here: a package attribute named ``settings`` is too easily confused with a module.
"""

from gateway.config.errors import ConfigError
from gateway.config.fields import CONFIG_ENV_VAR, ENV_PREFIX, Setting
from gateway.config.loading import add_arguments, load_config
from gateway.config.model import GatewayConfig
from gateway.config.rendering import config_reference, config_to_dict, config_to_toml

__all__ = [
    "CONFIG_ENV_VAR",
    "ENV_PREFIX",
    "ConfigError",
    "GatewayConfig",
    "Setting",
    "add_arguments",
    "config_reference",
    "config_to_dict",
    "config_to_toml",
    "load_config",
]
