"""Kafka topics as the product reads, writes and checks them.

- ``produce_consume``: ``lake produce`` and ``lake consume`` (kcat's two verbs), with exact line numbers.
- ``partitioners``: the Java client's murmur2 and librdkafka's consistent_random, bit-exact.
- ``keys``: key hygiene, the invisible bytes that make two equal-looking keys differ.
- ``snapshots``: a topic as it is now (its end offsets), and Spark reading it up to them.
- ``ingest``: ``lake ingest``, each topic mirrored into a bronze Delta table.
- ``repair``: ``lake topic repartition``, a topic written with a foreign partitioner rewritten.
- ``diagnose``: ``lake diagnose``, two topics side by side.
"""
