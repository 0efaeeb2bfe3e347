"""One way to build a SparkSession that works on a laptop, in CI and on a cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = ["session"]


def session(
    app_name: str,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one.

    ``master`` defaults to ``$SPARK_MASTER`` and then ``local[2]``; under
    ``spark-submit`` the master it was given wins because the session already
    exists. The Python workers must run this interpreter: a bare ``python3`` on the
    PATH usually lacks pyarrow, which the Python Data Source API needs.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts the JVM first and hands its master over through the
    # gateway it opens (PYSPARK_GATEWAY_PORT): a master set here would override
    # the one given on its command line.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if SparkSession.getActiveSession() is None and master is None and not submitted:
        master = os.environ.get("SPARK_MASTER", "local[2]")
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Local mode: loopback only, no web UI, no 200-partition shuffles of tiny data.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
