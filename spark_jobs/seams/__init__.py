"""The seams: one module per outside system, and nothing else in the package talks to that system.

- ``kafka``: every conversation with a Kafka cluster (admin, producer, consumer; confluent-kafka), and
  Spark's Kafka client options.
- ``broker``: the embedded single-node KRaft broker of ``make demo`` (``lake kafka start | stop``).
- ``session``: the only place a SparkSession is built (locked jars, Delta, the state store, a cluster).
- ``connect``: the lake's Spark Connect server (``lake up``), a long-lived driver for quick commands.
- ``delta``: every Delta table read and written through :class:`~spark_jobs.seams.delta.Lake`.
- ``layout``: the lake root, spelled once: every folder, file and table name under a root.
- ``system_tables``: the schemas of the lake's own tables (quarantine, quality runs, join metrics).
- ``checkpoints``: reading Spark Structured Streaming checkpoints.
- ``marts``: the dbt seam (dbt-spark in session mode).
- ``jvm``: the locked JVM pieces (jars, the join operators' jar, the class-data archive).
- ``processes``: what the background services (broker, Connect server) share: state files, start, stop.
"""
