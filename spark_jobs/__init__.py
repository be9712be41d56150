"""Kafka-style keyed joins kept in a lakehouse: Spark computes, Delta Lake (delta-spark) stores.

Seams to the outside world, one each:
  - storage:        :mod:`spark_jobs.seams.delta` (Delta tables under the lake root)
  - Spark session:  :mod:`spark_jobs.seams.session`
  - configuration:  :mod:`spark_jobs.seams.config`
Everything else is plain functions over Arrow tables or Spark DataFrames.
"""

__version__ = "0.1.0"
