"""Spark on the bus: the analytics job, Spark jobs as Application-Agents, and the
``asbp`` PySpark Data Source.

Importing this package needs ``pyspark`` (the ``spark`` extra); the rest of
``agents`` never imports it.
"""
