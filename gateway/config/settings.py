"""The old home of configuration loading, kept so that code written against it still runs.

Loading, checking and writing a configuration now live in their own modules (see
:mod:`gateway.config`); this module re-exports the names it used to define. Import
from :mod:`gateway.config` in new code. Kept while ``gateway/ops/cli.py`` (reworked on
another branch) still imports from here; delete it once nothing does.
"""

from __future__ import annotations

from gateway.config.checks import BROKER_ID_PATTERN
from gateway.config.errors import ConfigError
from gateway.config.fields import (
    CONFIG_ENV_VAR,
    ENV_PREFIX,
    FOREIGN_ENV_VARS,
    LOG_LEVELS,
    Setting,
    settings,
)
from gateway.config.loading import add_arguments, load_config
from gateway.config.rendering import config_reference, config_to_dict, config_to_toml

__all__ = [
    "BROKER_ID_PATTERN",
    "CONFIG_ENV_VAR",
    "ENV_PREFIX",
    "FOREIGN_ENV_VARS",
    "LOG_LEVELS",
    "ConfigError",
    "Setting",
    "add_arguments",
    "config_reference",
    "config_to_dict",
    "config_to_toml",
    "load_config",
    "settings",
]
