"""``python -m gateway.config > docs/configuration.md``: print the configuration reference."""

import sys

from gateway.config.rendering import config_reference

sys.stdout.write(config_reference())
