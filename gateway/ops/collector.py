"""How the broker's process runs Python's cyclic garbage collector.

Why this exists
---------------
A full (generation 2) collection walks every object the collector tracks: with
10,000 Channels open, about 0.85 s of CPU each, a pause for every Channel. By
default CPython runs one after every 10 collections of generation 1 (once the
objects that reached generation 2 since the last one are a quarter of those it
kept then). Connections that come and go reach generation 2 while they live,
so churn alone triggers them: in the soak (bench/soak.py, 1,000 connects/s
asked, 10,000 Channels held, issue 16) 29 full collections took 24.8 s of the
broker's 42 s of CPU.

Two settings, once the broker is up (:func:`tune_collector`):

* ``gc.freeze()``: what start-up allocated (modules, the app, the engine's
  scripts) lives as long as the process; frozen, no collection walks it.
* Full collections after :data:`FULL_COLLECTION_THRESHOLD` collections of
  generation 1 instead of 10: about one a minute at 1,000 connects/s instead of
  one every two seconds. This is safe only because a closed connection leaves
  no reference cycle for the collector to free (gateway/transports/
  connection_cycles.py; tests/gateway/transports/test_connection_cycles.py
  holds it): with the cycles, the same setting let the broker grow by about
  17 KiB per connect; without them, 7 MiB over 59,853 connects (bench/README.md).
  Generations 0 and 1 keep their thresholds: they walk only young objects.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["FULL_COLLECTION_THRESHOLD", "tune_collector"]

#: Collections of generation 1 between two full collections (CPython's default: 10).
FULL_COLLECTION_THRESHOLD: Final = 1_000


def tune_collector() -> None:
    """Freeze what exists now and make full collections rare; call once start-up is done."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
