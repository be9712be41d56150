"""Topic commands: ``produce`` / ``consume`` (kcat-like, on Kafka), ``diagnose`` (two topics side by
side, read-only), ``topics``, ``topic repartition`` and ``ingest`` (Kafka -> bronze)."""

from __future__ import annotations

import sys

from spark_jobs.cli.common import Parser, Progress, context
from spark_jobs.config import PARTITIONERS
from spark_jobs.errors import UserError


def register(sub, common) -> None:
    for add in (_produce, _consume, _ingest, _topic, _diagnose, _topics):
        add(sub, common)


def _produce(sub, common) -> None:
    """``lake produce``."""
    p = sub.add_parser(
        "produce",
        parents=[common],
        help="produce lines as records to a Kafka topic (like kcat -P -l)",
        description="One record per line of FILE (or stdin). One Kafka transaction per call: a bad line "
        "anywhere and nothing is visible.",
    )
    p.add_argument("topic")
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("-K", dest="key_sep", metavar="SEP", help="key separator: key SEP value")
    p.add_argument("-Z", dest="null_empty", action="store_true", help="empty key/value -> null")
    p.add_argument("--partitioner", choices=PARTITIONERS)
    p.add_argument("--timestamp", type=int, metavar="MS", help="record timestamp, epoch ms")
    for part in ("key", "value"):
        p.add_argument(
            f"--{part}-schema",
            metavar="FILE",
            help=f"a Schema Registry topic's {part}s: write them with this schema (.avsc, .proto, JSON "
            f"Schema .json), registered under the {part} subject first (default: the topic's schema "
            "file, else the subject's latest version)",
        )
    p.set_defaults(run=cmd_produce)


def _consume(sub, common) -> None:
    """``lake consume``."""
    c = sub.add_parser(
        "consume",
        parents=[common],
        help="print a Kafka topic's records (like kcat -C -e -f)",
        description="Committed records in partition, offset order, up to the end as the call starts.",
    )
    c.add_argument("topic")
    c.add_argument(
        "-f",
        dest="fmt",
        default="%s\\n",
        help="format: %%k %%s %%K %%S %%p %%o %%T %%t %%h, and %%i / %%I the value's / key's schema id "
        "(Schema Registry topics)",
    )
    c.add_argument("-o", dest="start", default="beginning", help="beginning | end | N | -N")
    c.add_argument("-c", dest="count", type=int, help="stop after COUNT records")
    c.add_argument("-p", dest="partition", type=int, help="only this partition")
    c.add_argument("-Z", dest="null_text", action="store_true", help="print null keys/values as NULL")
    c.add_argument(
        "--raw",
        action="store_true",
        help="Schema Registry topics: print keys and values as their bytes (default: decoded, as JSON)",
    )
    c.set_defaults(run=cmd_consume)


def _ingest(sub, common) -> None:
    """``lake ingest``."""
    ing = sub.add_parser(
        "ingest",
        parents=[common],
        help="mirror Kafka topics into their bronze Delta tables (Spark, exactly once)",
    )
    ing.add_argument("topics", nargs="*", metavar="TOPIC", help="default: every declared topic")
    mode = ing.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="everything available now, then exit (default)")
    mode.add_argument("--continuous", action="store_true", help="until SIGTERM / Ctrl-C")
    mode.add_argument(
        "--detach",
        action="store_true",
        help="start the pipeline's continuous ingest as a detached job (nothing happens if it runs)",
    )
    mode.add_argument("--stop", action="store_true", help="stop the detached continuous ingest")
    ing.add_argument(
        "--trigger", type=float, default=1.0, metavar="SECONDS", help="continuous: batch interval"
    )
    ing.add_argument("--max-records", type=int, metavar="N", help="at most N offsets per topic and batch")
    ing.set_defaults(run=cmd_ingest)


def _topic(sub, common) -> None:
    """``lake topic repartition``."""
    tp = sub.add_parser("topic", parents=[common], help="topic maintenance (repartition)")
    tsub = tp.add_subparsers(dest="topic_command", metavar="ACTION", parser_class=Parser)
    rp = tsub.add_parser(
        "repartition",
        parents=[common],
        help="replace a Kafka topic with a copy of its records placed by the right partitioner",
    )
    rp.add_argument("topic")
    rp.add_argument("--partitioner", choices=PARTITIONERS, help="default: the topic's")
    rp.set_defaults(run=cmd_repartition)


def _diagnose(sub, common) -> None:
    """``lake diagnose``."""
    d = sub.add_parser(
        "diagnose",
        parents=[common],
        help="compare two Kafka topics: partitioners, co-partitioning, key hygiene (read-only)",
        description="Reads both topics to their end offsets as the command starts (no consumer group "
        "offsets, nothing written) and reports partition counts, which partitioner each topic's "
        "placements fit, misplaced keys, keys whose partition differs between the topics, key hygiene "
        "and keys missing from one of them. Exit 0 when the topics are co-partitioned and their keys "
        "clean, 1 otherwise. Topic names are Kafka's, as they are on the cluster.",
    )
    d.add_argument("topic_a")
    d.add_argument("topic_b")
    d.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="the cluster (default: the pipeline's, else $LAKE_KAFKA_BOOTSTRAP, else the embedded broker)",
    )
    d.add_argument(
        "-X",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a client setting, librdkafka's name (e.g. -X security.protocol=SASL_SSL); repeatable",
    )
    d.add_argument(
        "--partitioner",
        choices=("murmur2", "crc32"),
        default="murmur2",
        help="where keys are expected to be (default murmur2: Kafka's Java clients and Kafka Streams; "
        "crc32: librdkafka's consistent_random, kcat)",
    )
    d.add_argument("--sample", type=_positive, default=10, metavar="N", help="keys listed per finding")
    d.add_argument(
        "--registry",
        metavar="URL",
        help="a Schema Registry that decodes framed keys, to find a key framed on one topic and plain on "
        "the other (default: the pipeline's, $LAKE_SCHEMA_REGISTRY_URL or the embedded one, if any)",
    )
    d.add_argument("--json", action="store_true", help="the findings as JSON on stdout")
    d.set_defaults(run=cmd_diagnose)


def _topics(sub, common) -> None:
    """``lake topics``."""
    t = sub.add_parser("topics", parents=[common], help="the pipeline's topics: on Kafka and in bronze")
    t.add_argument("--create", action="store_true", help="create the declared topics that are missing")
    t.set_defaults(run=cmd_topics)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"--sample: expected a positive whole number, got {text!r}")
    return int(text)


def cmd_diagnose(args) -> int:
    import json

    from spark_jobs.formats import LogicalKeys
    from spark_jobs.seams.kafka import Cluster, connect
    from spark_jobs.topics import diagnose

    settings = {}
    for item in args.settings:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"-X {item}: expected NAME=VALUE, e.g. -X security.protocol=SSL")
        settings[name.strip()] = value
    config, lake = context(args)
    if args.bootstrap:
        cluster = Cluster(args.bootstrap, settings, "", "--bootstrap")
    else:
        known = connect(config, lake.root)
        cluster = Cluster(known.bootstrap_servers, {**known.settings, **settings}, "", known.origin)
    logical = LogicalKeys(_registry(args, config, lake))
    bars: list[Progress] = []

    def progress(topic: str, records: int, total: int) -> None:
        if records == 0:  # a read of the topic starts
            if bars:
                bars[-1].done()
            bars.append(Progress(f"reading {topic}", total))
        else:
            bars[-1](records)

    try:
        found = diagnose.diagnose(
            cluster,
            args.topic_a,
            args.topic_b,
            args.partitioner,
            args.sample,
            progress=progress,
            logical=logical,
        )
    finally:
        if bars:
            bars[-1].done()
    print(json.dumps(found.as_dict(), indent=2) if args.json else diagnose.text(found))
    return 0 if found.co_partitioned and found.clean else 1


def _registry(args, config, lake):
    """The Schema Registry that decodes framed keys for ``lake diagnose``: ``--registry``, else the
    pipeline's (or $LAKE_SCHEMA_REGISTRY_URL, or the embedded one) when there is one; else none, and
    framed keys are compared by their bytes. A registry named but not answering is one line."""
    from spark_jobs.config import RegistrySpec
    from spark_jobs.seams.schema_registry import Registry, connect_registry

    if args.registry:
        registry = Registry(RegistrySpec(args.registry), "--registry")
    else:
        try:
            registry = connect_registry(config, lake.root)
        except UserError:
            return None
    registry.check()
    return registry


def cmd_produce(args) -> int:
    from pathlib import Path

    from spark_jobs.formats import Formats
    from spark_jobs.seams.kafka import connect
    from spark_jobs.topics.produce_consume import open_input, produce_lines, producing

    config, lake = context(args)
    spec = config.topic(args.topic)
    cluster = connect(config, lake.root)
    formats = Formats(config, lake.root, cluster.topic)  # the registry is asked only by its formats
    codecs = (
        formats.writing(spec.name, "key", Path(args.key_schema) if args.key_schema else None),
        formats.writing(spec.name, "value", Path(args.value_schema) if args.value_schema else None),
    )
    stream, source = open_input(args.file)
    progress = Progress(f"produce {spec.name}")
    try:
        with producing(lake, spec.name, log=lambda m: print(m, file=sys.stderr)) as transactional_id:
            result = produce_lines(
                cluster,
                spec,
                stream,
                source,
                key_sep=args.key_sep,
                null_empty=args.null_empty,
                partitioner=args.partitioner,
                timestamp_ms=args.timestamp,
                progress=progress,
                transactional_id=transactional_id,
                codecs=codecs,
            )
    finally:
        progress.done()
        if stream is not sys.stdin.buffer:
            stream.close()
    placed = ", ".join(f"p{i}={n}" for i, n in enumerate(result.per_partition))
    partitioner = args.partitioner or spec.partitioner
    print(
        f"produced {result.records:,} records ({result.tombstones:,} tombstones) to {result.topic} "
        f"with {partitioner} in {result.seconds:.2f}s [{placed}]",
        file=sys.stderr,
    )
    return 0


def cmd_consume(args) -> int:
    from spark_jobs.formats import Formats
    from spark_jobs.seams.kafka import connect
    from spark_jobs.topics.produce_consume import Rendering, consume

    config, lake = context(args)
    spec = config.topic(args.topic)
    if args.count is not None and args.count < 0:
        raise UserError("-c COUNT must not be negative")
    cluster = connect(config, lake.root)
    render = Rendering(raw=True)
    if not args.raw:  # a registry format's records decoded to JSON, any other's as they are
        formats = Formats(config, lake.root, cluster.topic)
        render = Rendering((formats.codec(spec.name, "key"), formats.codec(spec.name, "value")))
    consume(
        cluster,
        spec,
        sys.stdout.buffer,
        fmt=args.fmt,
        start=args.start,
        count=args.count,
        partition=args.partition,
        null_as=b"NULL" if args.null_text else b"",
        render=render,
    )
    if render.undecodable:
        print(
            f"lake consume: {render.undecodable} record(s) could not be decoded and were printed as they "
            f"are (first: {render.first})",
            file=sys.stderr,
        )
    return 0


def cmd_ingest(args) -> int:
    from spark_jobs.runtime.profile import watch_queries
    from spark_jobs.seams.session import get_spark
    from spark_jobs.topics.ingest import catch_up, run_continuous

    config, lake = context(args)
    for topic in args.topics:
        config.topic(topic)  # unknown names fail before Spark starts
    if args.max_records is not None and args.max_records < 1:
        raise UserError("--max-records must be at least 1")
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    if args.detach or args.stop:
        return _ingest_job(args, config, lake)
    spark = get_spark(app_name=f"ingest-{config.name}", root=lake.root)
    watch_queries(spark, lambda m: print(m, flush=True))
    log = lambda m: print(m, flush=True)  # noqa: E731
    if not args.continuous:
        catch_up(spark, lake, config, args.topics or None, max_records=args.max_records, log=log)
        return 0
    summary = run_continuous(
        spark,
        lake,
        config,
        args.topics or None,
        trigger_seconds=args.trigger,
        max_records=args.max_records,
        log=log,
    )
    print(summary.text())
    return 0


def _ingest_job(args, config, lake) -> int:
    from spark_jobs.config import resolve_config_path
    from spark_jobs.joins.supervise import launch_ingest, stop_ingest

    if args.topics or args.max_records:
        raise UserError("--detach and --stop act on the pipeline's whole ingest: no TOPIC or --max-records")
    if args.stop:
        state = stop_ingest(lake, config)
        print(f"{state.label}: " + (f"stopped (pid {state.pid})" if state.changed else "was not running"))
        return 0
    state = launch_ingest(lake, str(resolve_config_path(args.config).resolve()), config, args.trigger).wait()
    verb = "started" if state.changed else "already running"
    print(f"{state.label}: {verb} (pid {state.pid}); log: {state.log}")
    return 0


def cmd_repartition(args) -> int:
    from spark_jobs.seams.session import get_spark
    from spark_jobs.topics.repair import repartition

    config, lake = context(args)
    config.topic(args.topic)  # an unknown topic fails before Spark starts
    spark = get_spark(app_name="lake-repartition", root=lake.root)
    result = repartition(
        spark, lake, config, args.topic, args.partitioner, log=lambda m: print(m, flush=True)
    )
    if not result.replaced:
        print(
            f"{result.topic}: all {result.records:,} records already placed by {result.partitioner}; "
            f"nothing rewritten (read {result.read})"
        )
        return 0
    print(
        f"{result.topic}: replaced with a copy of its {result.records:,} records placed by "
        f"{result.partitioner} ({result.moved:,} changed partition, per-key order kept, offsets renumbered); "
        "its bronze table was rebuilt" + (f"; the copy read {result.read}" if result.read else "")
    )
    if result.restart:
        print(f"restart from scratch (their positions no longer apply): {', '.join(result.restart)}")
        print("  lookup tables rebuild themselves on their next refresh (lake ingest)")
        for job in result.restart:
            if job.startswith("join:"):
                print(f"  {job}: lake run {job.removeprefix('join:')} --once --reset")
        print("  Kafka consumers outside the product (a Kafka Streams app, ...) must reset their offsets")
    return 0


def cmd_topics(args) -> int:
    from spark_jobs.seams.kafka import connect, ensure_topics, watermarks
    from spark_jobs.topics.ingest import mirrored_up_to
    from spark_jobs.topics.lookup_tables import lookup_lag

    config, lake = context(args)
    cluster = connect(config, lake.root)
    print(f"pipeline {config.name} ({config.source}), lake {lake.root}, Kafka {cluster.bootstrap_servers}")
    if args.create:
        created = ensure_topics(cluster, config.topics.values())
        print(f"created: {', '.join(created) if created else 'none (all exist)'}")
    ends: dict[str, list[int] | None] = {}
    for spec in config.topics.values():
        ends[spec.name] = [high for _, high in watermarks(cluster, spec)] if _exists(cluster, spec) else None
        mirrored = mirrored_up_to(lake, spec)
        print(
            f"  {spec.name}: {spec.partitions} partitions, key {spec.key_format}, "
            f"value {spec.value_format}, partitioner {spec.partitioner}"
            f"{', compacted' if spec.compacted else ''}; Kafka {cluster.topic(spec.name)} "
            + (f"end offsets {ends[spec.name]}" if ends[spec.name] is not None else "(not created yet)")
            + (f"; bronze up to offsets {mirrored}" if mirrored is not None else "; not in bronze yet")
        )
    for lookup in config.lookups.values():
        print(f"  {lookup_lag(lake, lookup, ends[lookup.topic]).text()}")
    return 0


def _exists(cluster, spec) -> bool:
    from spark_jobs.seams.kafka import partition_counts

    return cluster.topic(spec.name) in partition_counts(cluster, [cluster.topic(spec.name)])
