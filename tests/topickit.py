"""Records onto the session's Kafka broker without the product's checks: kcat-style ``key SEP value``
lines produced as they are (bad input stays bad), placed by the partitioner a test names, so the
quality suites and the diagnosis find what they must."""

from __future__ import annotations

from spark_jobs.seams.kafka import connect, produce


def produce_lines(
    lake, config, topic: str, lines: bytes, sep: str = "|", partitioner: str = "murmur2"
) -> None:
    """``key SEP value`` lines into a topic in one transaction, unchecked."""
    from spark_jobs.topics.produce_consume import parse_lines, split_lines

    parsed = parse_lines(split_lines(lines), sep, False, "test", 1)
    cluster = connect(config, lake.root)
    produce(cluster, config.topic(topic), [(parsed.keys, parsed.values)], partitioner)
