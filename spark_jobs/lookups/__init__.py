"""Lookups: the compacted topics joins look values up in, and how they are filled.

- ``dumps``: dump files (the sources of backfills) read into Spark line by line.
- ``backfill``: ``lake backfill``, a dump loaded into a lookup's topic with the topic's partitioner.
- ``tables``: a lookup's topic kept as the Delta table ``lookup_<name>`` (latest value per key).
"""
