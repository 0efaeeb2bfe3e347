"""The ``asbp`` PySpark Data Source: topics and queues as streams and sinks.

::

    register(spark)
    stream = (
        spark.readStream.format("asbp")
        .option("url", "ws://broker:8080/asbp")
        .option("type", "QUEUE").option("destination", "orders")
        .option("walPath", "/data/orders-wal")  # beside the checkpoint: both must survive
        .load()
    )
    df.write.format("asbp").option("url", ...).option("destination", "/news").save()

The pieces, one concept each: :mod:`agents.spark.source_options` (options,
schema), :mod:`agents.spark.source_wal` (the write-ahead log that gives a
queue replayable offsets), :mod:`agents.spark.source_reader` (the streaming
reader), :mod:`agents.spark.sink` (batch and streaming writers). docs/spark.md
("The ``asbp`` Data Source") is the user's guide.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from agents.spark.sink import AsbpStreamWriter, AsbpWriter
from agents.spark.source_options import OptionError, SinkOptions, SourceOptions, source_schema
from agents.spark.source_reader import AsbpStreamReader

__all__ = ["AsbpDataSource", "OptionError", "register"]


class AsbpDataSource(DataSource):
    """``format("asbp")``: a streaming reader and batch and streaming writers."""

    @classmethod
    def name(cls) -> str:
        return "asbp"

    def schema(self) -> str:
        payload = self.options.get("payloadFormat", "binary")
        if payload not in ("binary", "string"):
            raise OptionError(f"option 'payloadFormat' must be binary or string, not {payload!r}")
        return source_schema("string" if payload == "string" else "binary")

    def streamReader(self, schema: StructType) -> AsbpStreamReader:
        return AsbpStreamReader(SourceOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return AsbpWriter(SinkOptions.parse(self.options, tuple(schema.fieldNames())))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return AsbpStreamWriter(SinkOptions.parse(self.options, tuple(schema.fieldNames())))


def register(spark: SparkSession) -> None:
    """Make ``format("asbp")`` available in ``spark``."""
    spark.dataSource.register(AsbpDataSource)
