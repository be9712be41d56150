"""Kafka-style keyed joins kept in a lakehouse: Spark computes, Delta Lake (delta-spark) stores.

Seams to the outside world, one module each under :mod:`spark_jobs.seams` (Kafka, Delta, the Spark
session, the Schema Registry, the object store, ...); the pipeline file's settings are
:mod:`spark_jobs.config`. Everything else is plain functions over Arrow tables or Spark DataFrames.
"""

__version__ = "0.1.0"
