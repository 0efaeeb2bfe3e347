"""The event log: one record for every Command the broker routes.

``schema`` defines the record; the recorder and the two stores (rotating NDJSON
files for the memory engine, a capped Redis Stream for the redis engine) build on
it. ``agents/spark`` reads it back.
"""
