"""Spark on the bus: the analytics job, Spark jobs as Application-Agents, and the
``asbp`` PySpark Data Source.

Most modules here need ``pyspark`` (the ``spark`` extra); ``agents.spark.parts``
(reading a SparkApplicationAgent's answers) does not, so a User-Agent can use it
without Spark. The rest of ``agents`` never imports this package.
"""
