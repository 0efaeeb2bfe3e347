"""The Spark side's errors: one branch of the SDK's tree, under ``asbp.AsbpError``.

::

    asbp.AsbpError
     └── agents.AgentError
          └── SparkError             anything agents.spark raises on purpose
               ├── EventSourceError  (events) the event log cannot be read
               ├── QueryError        (query) a query a Spark agent cannot answer;
               │                     .code: the fault it is answered with
               ├── OptionError       (source_options) a bad ``asbp`` Data Source
               │                     option; also a ValueError
               ├── WalError          (source_wal) the write-ahead log cannot serve
               └── PublishError      (analytics_publish) no Tube for the summary

This module imports no pyspark, so the parts of ``agents.spark`` that run
without it (``parts``, ``analytics_publish``, ``analytics_cli``) can use it.
"""

from __future__ import annotations

from agents.errors import AgentError

__all__ = ["SparkError"]


class SparkError(AgentError):
    """The root of every error ``agents.spark`` raises on purpose."""
