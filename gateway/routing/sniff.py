"""The ``u`` of a refused frame: :mod:`asbp.sniff`, re-exported where the broker imports it.

The search moved to the protocol core so that the SDK's Broker-Agent answers a
refused frame exactly as the broker does, without importing the broker.
"""

from __future__ import annotations

from asbp.sniff import SNIFF_WINDOW, sniff_command_id

__all__ = ["SNIFF_WINDOW", "sniff_command_id"]
