"""The broker's Prometheus metrics: plain counters on the hot path
(:mod:`gateway.metrics.counts`), turned into metric families only when
``/metrics`` is scraped (:mod:`gateway.metrics.collector`), every metric named
once in :mod:`gateway.metrics.catalogue`."""
