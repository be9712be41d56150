"""``lake``: the product's command line.

User mistakes (unknown topic, bad config, bad input line) print one line ``lake: error: …`` and exit
2; nothing is written in that case. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from spark_jobs import __version__
from spark_jobs.config import PARTITIONERS
from spark_jobs.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other user error
        raise UserError(f"{message} (see '{self.prog} --help')")


def _global_options(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--root", default=default, help="lake root directory (default: $LAKE_ROOT or ./lakehouse)"
    )
    parser.add_argument(
        "--config",
        default=default,
        help="pipeline YAML (default: $LAKE_CONFIG or the bundled demo pipeline)",
    )


def build_parser() -> argparse.ArgumentParser:
    # --root/--config are accepted before or after the command; after it they must not reset a value
    # given before it, hence SUPPRESS as the sub-commands' default.
    common = _Parser(add_help=False)
    _global_options(common, argparse.SUPPRESS)
    parser = _Parser(prog="lake", description="Kafka-style topics and keyed joins kept in a Delta lakehouse.")
    _global_options(parser, None)
    parser.add_argument("--version", action="version", version=f"lake {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

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
    p.set_defaults(run=cmd_produce)

    c = sub.add_parser(
        "consume",
        parents=[common],
        help="print a Kafka topic's records (like kcat -C -e -f)",
        description="Committed records in partition, offset order, up to the end as the call starts.",
    )
    c.add_argument("topic")
    c.add_argument("-f", dest="fmt", default="%s\\n", help="format: %%k %%s %%K %%S %%p %%o %%T %%t %%h")
    c.add_argument("-o", dest="start", default="beginning", help="beginning | end | N | -N")
    c.add_argument("-c", dest="count", type=int, help="stop after COUNT records")
    c.add_argument("-p", dest="partition", type=int, help="only this partition")
    c.add_argument("-Z", dest="null_text", action="store_true", help="print null keys/values as NULL")
    c.set_defaults(run=cmd_consume)

    k = sub.add_parser("kafka", parents=[common], help="the embedded single-node Kafka broker (KRaft)")
    ksub = k.add_subparsers(dest="kafka_command", metavar="ACTION", parser_class=_Parser)
    ks = ksub.add_parser(
        "start",
        parents=[common],
        help="start the broker (data and log under <root>/_kafka); returns once it answers",
    )
    ks.add_argument("--port", type=int, default=None, help="loopback port (default $LAKE_KAFKA_PORT or 9092)")
    ks.add_argument(
        "--sasl-user",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="also open a SASL_PLAINTEXT listener (PLAIN) with this user (repeatable)",
    )
    ks.add_argument("--sasl-port", type=int, help="the SASL listener's port (default: port + 2)")
    ks.set_defaults(run=cmd_kafka_start)
    kt = ksub.add_parser("stop", parents=[common], help="stop the broker (controlled shutdown)")
    kt.set_defaults(run=cmd_kafka_stop)
    kst = ksub.add_parser("status", parents=[common], help="is the broker running, and where")
    kst.add_argument("--json", action="store_true", help='{"running": ..., "bootstrap_servers": ...}')
    kst.set_defaults(run=cmd_kafka_status)

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

    b = sub.add_parser(
        "backfill",
        parents=[common],
        help="load a dump into a lookup's topic (only what changes something), then refresh the lookup",
    )
    b.add_argument("lookup")
    b.add_argument("--from", dest="source", metavar="FILE", help="the dump (default: from config)")
    b.add_argument("-K", dest="key_sep", metavar="SEP", help="key separator of 'lines' dumps")
    b.add_argument("--partitioner", choices=PARTITIONERS)
    b.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    b.add_argument("--max-rejects", type=int, default=0, metavar="N", help="fail above N bad lines")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON to FILE")
    b.set_defaults(run=cmd_backfill)

    q = sub.add_parser(
        "check",
        parents=[common],
        help="run the data-quality suites (exit 0 pass, 1 a check failed, 2 could not check)",
    )
    q.add_argument("suites", nargs="*", metavar="SUITE", help="default: all suites of the pipeline")
    q.add_argument("--report-dir", help="where Data Docs and summaries go (default: <root>/reports/quality)")
    q.add_argument("--json", action="store_true", help="print the JSON summary")
    q.add_argument("--summary-json", metavar="FILE", help="also write the JSON summary to FILE")
    q.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 when the checks ran, passed or not (a gate decides later)",
    )
    q.set_defaults(run=cmd_check)

    tp = sub.add_parser("topic", parents=[common], help="topic maintenance (repartition)")
    tsub = tp.add_subparsers(dest="topic_command", metavar="ACTION", parser_class=_Parser)
    rp = tsub.add_parser(
        "repartition",
        parents=[common],
        help="replace a Kafka topic with a copy of its records placed by the right partitioner",
    )
    rp.add_argument("topic")
    rp.add_argument("--partitioner", choices=PARTITIONERS, help="default: the topic's")
    rp.set_defaults(run=cmd_repartition)

    sh = sub.add_parser(
        "show",
        parents=[common],
        help="print a table's current rows sorted by key, or with --changes its change feed",
    )
    sh.add_argument("table")
    sh.add_argument("--changes", action="store_true", help="the change feed in commit order")
    sh.add_argument("--json", action="store_true", help="one JSON object per line")
    sh.set_defaults(run=cmd_show)

    db = sub.add_parser(
        "dbt",
        parents=[common],
        help="run dbt on the lake (dbt-spark, session mode): e.g. 'lake dbt build'",
        description="Runs dbt with the project in dbt/ in a Spark session that sees the lake's tables as "
        "global_temp.<table>; the marts are tables marts.<name> under <root>/warehouse.",
    )
    db.add_argument("dbt_args", nargs=argparse.REMAINDER, help="dbt's command and options")
    db.set_defaults(run=cmd_dbt)

    sq = sub.add_parser(
        "sql",
        parents=[common],
        help="run a Spark SQL query over the marts (marts.<name>) and the lake (global_temp.<table>)",
    )
    sq.add_argument("query")
    sq.add_argument("--json", action="store_true", help="one JSON object per line")
    sq.set_defaults(run=cmd_sql)

    rep = sub.add_parser(
        "report",
        parents=[common],
        help="write the pipeline's data-quality report page (also written after every quality run)",
    )
    rep.set_defaults(run=cmd_report)

    r = sub.add_parser(
        "run",
        parents=[common],
        help="run a join: --once (everything available, then exit) or --continuous (until stopped)",
        description="Runs a join of the pipeline as a Spark Structured Streaming query. It resumes where "
        "it stopped (checkpoint under <root>/_checkpoints/JOIN). --continuous stops after the current "
        "micro-batch on SIGTERM or Ctrl-C.",
    )
    r.add_argument("join")
    mode = r.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="process everything available, then exit")
    mode.add_argument("--continuous", action="store_true", help="run until SIGTERM / Ctrl-C")
    r.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS", help="micro-batch interval")
    r.add_argument("--max-files", type=int, metavar="N", help="at most N data files per topic per batch")
    r.add_argument("--reset", action="store_true", help="forget the join's state and result first")
    r.set_defaults(run=cmd_run)

    sj = sub.add_parser(
        "start",
        parents=[common],
        help="start a join's continuous job as a detached process (nothing happens if it runs)",
    )
    sj.add_argument("join")
    sj.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS", help="micro-batch interval")
    sj.set_defaults(run=cmd_start)

    sp = sub.add_parser("stop", parents=[common], help="stop a join's continuous job after its current batch")
    sp.add_argument("join")
    sp.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="how long to wait")
    sp.set_defaults(run=cmd_stop)

    st = sub.add_parser("status", parents=[common], help="the joins: running?, last batch, inputs behind")
    st.add_argument("--json", action="store_true", help="one JSON object per join")
    st.set_defaults(run=cmd_status)

    he = sub.add_parser(
        "health",
        parents=[common],
        help="exit 1 (and say why) when a join's job is down, stuck, or too far behind its inputs",
    )
    he.add_argument("joins", nargs="*", metavar="JOIN", help="default: every join of the pipeline")
    he.add_argument(
        "--max-behind", type=int, metavar="N", help="versions (default: airflow.max_versions_behind)"
    )
    he.set_defaults(run=cmd_health)

    af = sub.add_parser(
        "airflow",
        parents=[common],
        help="run an airflow command with this repo's DAGs, lake root and Spark master (see README)",
        description="Runs 'airflow ARGS' with AIRFLOW_HOME (default ./.airflow, or $LAKE_AIRFLOW_HOME), "
        "the dags/ folder, no example DAGs, the lake root and the Spark connection configured. "
        "Example: lake airflow standalone",
    )
    af.add_argument("airflow_args", nargs=argparse.REMAINDER, metavar="ARGS")
    af.set_defaults(run=cmd_airflow)

    au = sub.add_parser(
        "audit",
        parents=[common],
        help="compare a join's result with a batch join of its topics (exit 1 when they differ)",
    )
    au.add_argument("join")
    au.add_argument("--json", action="store_true", help="print the report as JSON")
    au.set_defaults(run=cmd_audit)

    t = sub.add_parser("topics", parents=[common], help="the pipeline's topics: on Kafka and in bronze")
    t.add_argument("--create", action="store_true", help="create the declared topics that are missing")
    t.set_defaults(run=cmd_topics)

    d = sub.add_parser(
        "demo",
        parents=[common],
        help="the demo: topics -> quality gate (fails) -> backfill -> gate (passes) -> joins -> audit",
    )
    d.add_argument(
        "stories",
        nargs="*",
        metavar="STORY",
        help="consents (the default: gate, backfill, table and stream-table joins), marketplace "
        "(foreign-key and derive joins), people (list join); each uses its bundled pipeline",
    )
    d.add_argument("--topics-only", action="store_true", help="only write and print the demo topics")
    d.set_defaults(run=cmd_demo)

    g = sub.add_parser(
        "generate-dump",
        parents=[common],
        help="write a large synthetic key;value dump (for benchmarks)",
    )
    g.add_argument("out")
    g.add_argument("--keys", type=int, required=True)
    g.add_argument("--prefix", default="user_")
    g.set_defaults(run=cmd_generate_dump)
    return parser


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def _context(args):
    from spark_jobs.config import load_config
    from spark_jobs.lake import Lake

    return load_config(args.config), Lake(args.root)


class Progress:
    """Records/s on stderr while a long call runs (only when stderr is a terminal)."""

    def __init__(self, label: str):
        self.label = label
        self.count = 0
        self.started = time.monotonic()
        self.last = self.started
        self.enabled = sys.stderr.isatty()

    def __call__(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self.last >= 1.0:
            rate = self.count / max(now - self.started, 1e-9)
            print(f"\r{self.label}: {self.count:,} records ({rate:,.0f}/s)", end="", file=sys.stderr)
            self.last = now

    def done(self) -> None:
        if self.enabled and self.last != self.started:
            print(file=sys.stderr)


def cmd_produce(args) -> int:
    from spark_jobs.kafka import connect
    from spark_jobs.topics import open_input, produce_lines, producing

    config, lake = _context(args)
    spec = config.topic(args.topic)
    cluster = connect(config, lake.root)
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
    from spark_jobs.kafka import connect
    from spark_jobs.topics import consume

    config, lake = _context(args)
    spec = config.topic(args.topic)
    if args.count is not None and args.count < 0:
        raise UserError("-c COUNT must not be negative")
    consume(
        connect(config, lake.root),
        spec,
        sys.stdout.buffer,
        fmt=args.fmt,
        start=args.start,
        count=args.count,
        partition=args.partition,
        null_as=b"NULL" if args.null_text else b"",
    )
    return 0


def cmd_kafka_start(args) -> int:
    from spark_jobs import broker
    from spark_jobs.config import resolve_root

    users = {}
    for item in args.sasl_user:
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise UserError(f"--sasl-user must be USER:PASSWORD, got {item!r}")
        users[user] = password
    port = args.port or int(os.environ.get("LAKE_KAFKA_PORT", broker.DEFAULT_PORT))
    state = broker.start(
        resolve_root(args.root), port, args.sasl_port, users, log=lambda m: print(m, file=sys.stderr)
    )
    print(state.text())
    return 0


def cmd_kafka_stop(args) -> int:
    from spark_jobs import broker
    from spark_jobs.config import resolve_root

    stopped = broker.stop(resolve_root(args.root), log=lambda m: print(m, file=sys.stderr))
    print("embedded Kafka broker: stopped" if stopped else "embedded Kafka broker: was not running")
    return 0


def cmd_kafka_status(args) -> int:
    import json

    from spark_jobs import broker
    from spark_jobs.config import resolve_root

    state = broker.status(resolve_root(args.root))
    print(json.dumps(state.as_dict()) if args.json else state.text())
    return 0


def cmd_ingest(args) -> int:
    from spark_jobs.ingest import run_ingest
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    for topic in args.topics:
        config.topic(topic)  # unknown names fail before Spark starts
    if args.max_records is not None and args.max_records < 1:
        raise UserError("--max-records must be at least 1")
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    if args.detach or args.stop:
        return _ingest_job(args, config, lake)
    spark = get_spark(app_name=f"ingest-{config.name}")
    summary = run_ingest(
        spark,
        lake,
        config,
        args.topics or None,
        once=not args.continuous,
        trigger_seconds=args.trigger,
        max_records=args.max_records,
        log=lambda m: print(m, flush=True),
    )
    if args.continuous:
        print(summary.text())
    return 0


def _ingest_job(args, config, lake) -> int:
    from spark_jobs.config import resolve_config_path
    from spark_jobs.joins.supervise import start_ingest, stop_ingest

    if args.topics or args.max_records:
        raise UserError("--detach and --stop act on the pipeline's whole ingest: no TOPIC or --max-records")
    if args.stop:
        state = stop_ingest(lake, config)
        print(f"{state.label}: " + (f"stopped (pid {state.pid})" if state.changed else "was not running"))
        return 0
    state = start_ingest(lake, str(resolve_config_path(args.config).resolve()), config, args.trigger)
    verb = "started" if state.changed else "already running"
    print(f"{state.label}: {verb} (pid {state.pid}); log: {state.log}")
    return 0


def cmd_backfill(args) -> int:
    import json

    from spark_jobs.backfill import run_backfill
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    config.lookup(args.lookup)  # fail fast, before Spark starts
    if args.max_rejects < 0:
        raise UserError("--max-rejects must not be negative")
    if args.source:
        from spark_jobs.dumps import local_source

        args.source = local_source(args.source)

    _stderr("starting Spark ...")
    spark = get_spark(app_name=f"backfill-{args.lookup}")
    with SparkProgress(spark):
        summary = run_backfill(
            spark,
            lake,
            config,
            args.lookup,
            source=args.source,
            separator=args.key_sep,
            partitioner=args.partitioner,
            dry_run=args.dry_run,
            max_rejects=args.max_rejects,
            log=_stderr,
        )
    print(json.dumps(summary.as_dict()) if args.json else summary.text())
    if args.summary_json:
        _write_json(args.summary_json, summary.as_dict())
    return 0


def _write_json(path: str, data: dict) -> None:
    import json
    from pathlib import Path

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    tmp.replace(target)


def cmd_check(args) -> int:
    import json
    from pathlib import Path

    from spark_jobs.quality import load_suite, run_suites
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    for name in args.suites or config.quality.suites:  # validate suite files before Spark starts
        if name not in config.quality.suites:
            known = ", ".join(config.quality.suites) or "none"
            raise UserError(f"unknown suite '{name}' in {config.source} (declared: {known})")
        load_suite(config.quality.suites[name], config)

    _stderr("starting Spark ...")
    spark = get_spark(app_name="quality")
    try:
        with SparkProgress(spark):
            report = run_suites(
                spark,
                lake,
                config,
                args.suites or None,
                Path(args.report_dir) if args.report_dir else None,
                log=_stderr,
            )
    except UserError:
        raise
    except Exception as exc:  # the checks could not run: exit 2, not a pass or a fail
        raise UserError(
            f"could not run the quality suites: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from exc
    if args.summary_json:
        _write_json(args.summary_json, report.as_dict())
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for r in report.results:
            print(f"{'PASS' if r.success else 'FAIL'}  {r.suite} / {r.check}: {r.description}")
        print(f"\nsummary: {report.summary_html}")
        if report.data_docs:
            print(f"Data Docs: {report.data_docs}")
    return 0 if report.success or args.exit_zero else 1


class SparkProgress:
    """A one-line bar of Spark task progress on stderr while a job runs (terminals only)."""

    def __init__(self, spark):
        self.tracker = spark.sparkContext.statusTracker()
        self.enabled = sys.stderr.isatty()
        self._stop = None

    def __enter__(self):
        if not self.enabled:
            return self
        import threading

        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.wait(0.5):
                stages = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
                stages = [s for s in stages if s is not None]
                total = sum(s.numTasks for s in stages)
                done = sum(s.numCompletedTasks for s in stages)
                if total:
                    width = 30
                    filled = int(width * done / total)
                    bar = "#" * filled + "-" * (width - filled)
                    print(f"\r[{bar}] {done}/{total} tasks", end="", file=sys.stderr)

        threading.Thread(target=poll, daemon=True).start()
        return self

    def __exit__(self, *exc):
        if self._stop is not None:
            self._stop.set()
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr)


def cmd_repartition(args) -> int:
    from spark_jobs.repair import repartition
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    config.topic(args.topic)  # an unknown topic fails before Spark starts
    spark = get_spark(app_name="lake-repartition")
    result = repartition(
        spark, lake, config, args.topic, args.partitioner, log=lambda m: print(m, flush=True)
    )
    if not result.replaced:
        print(
            f"{result.topic}: all {result.records:,} records already placed by {result.partitioner}; "
            "nothing rewritten"
        )
        return 0
    print(
        f"{result.topic}: replaced with a copy of its {result.records:,} records placed by "
        f"{result.partitioner} ({result.moved:,} changed partition, per-key order kept, offsets renumbered); "
        "its bronze table was rebuilt"
    )
    if result.restart:
        print(f"restart from scratch (their positions no longer apply): {', '.join(result.restart)}")
        print("  lookups rebuild themselves on their next refresh (lake backfill / lake check)")
        for job in result.restart:
            if job.startswith("join:"):
                print(f"  {job}: lake run {job.removeprefix('join:')} --once --reset")
        print("  Kafka consumers outside the product (a Kafka Streams app, ...) must reset their offsets")
    return 0


def cmd_show(args) -> int:
    from spark_jobs.lake import Lake
    from spark_jobs.show import render, table_rows

    lake = Lake(args.root)
    columns, rows = table_rows(lake, args.table, changes=args.changes)
    for line in render(columns, rows, args.json):
        print(line)
    return 0


def cmd_dbt(args) -> int:
    from spark_jobs.lake import Lake
    from spark_jobs.marts import run_dbt

    return run_dbt(Lake(args.root), args.dbt_args, log=_stderr)


def cmd_sql(args) -> int:
    from spark_jobs.lake import Lake
    from spark_jobs.marts import query
    from spark_jobs.show import render

    columns, rows = query(Lake(args.root), args.query, log=_stderr)
    for line in render(columns, rows, args.json):
        print(line)
    return 0


def cmd_report(args) -> int:
    from spark_jobs.report import write_report

    config, lake = _context(args)
    print(write_report(lake, config))
    return 0


def cmd_run(args) -> int:
    from spark_jobs.joins.runner import reset_join, run_join
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    config.join(args.join)  # fail fast, before Spark starts
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    if args.max_files is not None and args.max_files < 1:
        raise UserError("--max-files must be at least 1")
    if args.reset:
        for item in reset_join(lake, config, args.join):
            _stderr(f"reset: removed {item}")
    _stderr("starting Spark ...")
    spark = get_spark(app_name=f"join-{args.join}")
    summary = run_join(
        spark,
        lake,
        config,
        args.join,
        once=args.once,
        trigger_seconds=args.trigger,
        max_files=args.max_files,
        log=_stderr,
    )
    print(summary.text())
    return 0


def cmd_start(args) -> int:
    from spark_jobs.config import resolve_config_path
    from spark_jobs.joins.supervise import start_ingest, start_join

    config, lake = _context(args)
    spec = config.join(args.join)
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    config_path = str(resolve_config_path(args.config).resolve())
    ingest = start_ingest(lake, config_path, config)  # the join sees new Kafka records only through it
    if ingest.changed:
        print(f"{ingest.label}: started (pid {ingest.pid}); log: {ingest.log}")
    state = start_join(lake, config_path, spec, args.trigger)
    verb = "started" if state.changed else "already running"
    print(f"{state.label}: {verb} (pid {state.pid}); log: {state.log}")
    return 0


def cmd_stop(args) -> int:
    from spark_jobs.joins.supervise import stop_join

    config, lake = _context(args)
    state = stop_join(lake, config.join(args.join), args.timeout)
    print(f"{state.label}: " + (f"stopped (pid {state.pid})" if state.changed else "was not running"))
    return 0


def cmd_status(args) -> int:
    import json

    from spark_jobs.joins.runner import status
    from spark_jobs.joins.supervise import ingest_status

    config, lake = _context(args)
    rows = status(lake, config)
    ingest = ingest_status(lake, config)
    if args.json:
        print(json.dumps(ingest))
        for row in rows:
            print(json.dumps(row))
        return 0
    state = (
        f"running (pid {ingest['pid']}, heartbeat {ingest['heartbeat_at']})"
        if ingest["running"]
        else "stopped"
    )
    print(f"ingest ({ingest['job']}): {state}")
    if not rows:
        print(f"no joins declared in {config.source}")
    for row in rows:
        state = f"running (pid {row['pid']})" if row["running"] else "stopped"
        behind = row["versions_behind"]
        lag = ", ".join(f"{side} {'-' if n is None else n}" for side, n in behind.items())
        last = (
            f"last batch {row['last_batch_at']}: {row['last_batch_in']} in, {row['last_batch_out']} out, "
            f"{row['last_batch_ms']} ms, {row['pending']} pending"
            if row["last_batch_at"]
            else "no batch yet"
        )
        print(f"{row['join']} ({row['kind']}): {state}; versions behind: {lag}; {last}")
    return 0


def cmd_health(args) -> int:
    from spark_jobs.joins.supervise import health

    config, lake = _context(args)
    for name in args.joins:
        config.join(name)
    limit = config.airflow.max_versions_behind if args.max_behind is None else args.max_behind
    if limit < 0:
        raise UserError("--max-behind must not be negative")
    problems = health(lake, config, limit, args.joins or None)
    for problem in problems:
        print(f"UNHEALTHY: {problem}")
    if not problems:
        print(
            f"healthy: {', '.join(args.joins or config.joins) or 'no joins'} (limit {limit} versions behind)"
        )
    return 1 if problems else 0


def cmd_airflow(args) -> int:
    from spark_jobs.orchestration.environment import run_airflow

    return run_airflow(args.airflow_args, root=args.root, config=args.config)


def cmd_audit(args) -> int:
    import json

    from spark_jobs.joins.oracle import SAMPLE, audit
    from spark_jobs.session import get_spark

    config, lake = _context(args)
    config.join(args.join)
    if not lake.exists(args.join):
        raise UserError(f"join {args.join} has no result yet: run 'lake run {args.join} --once' first")
    _stderr("starting Spark ...")
    report = audit(get_spark(app_name=f"audit-{args.join}"), lake, config, args.join)
    if args.json:
        print(
            json.dumps(
                {
                    "join": report.join,
                    "clean": report.clean,
                    "expected_rows": report.expected_rows,
                    "actual_rows": report.actual_rows,
                    "differing_keys": [k.decode("utf-8", "backslashreplace") for k in report.differing_keys],
                }
            )
        )
    else:
        print(report.text())
        for label, rows in (("missing", report.missing), ("unexpected", report.unexpected)):
            for row in rows[:SAMPLE]:
                print(f"  {label}: {row}")
    return 0 if report.clean else 1


def cmd_topics(args) -> int:
    from spark_jobs.ingest import next_offsets
    from spark_jobs.kafka import connect, ensure_topics, watermarks

    config, lake = _context(args)
    cluster = connect(config, lake.root)
    print(f"pipeline {config.name} ({config.source}), lake {lake.root}, Kafka {cluster.bootstrap_servers}")
    if args.create:
        created = ensure_topics(cluster, config.topics.values())
        print(f"created: {', '.join(created) if created else 'none (all exist)'}")
    for spec in config.topics.values():
        ends = [high for _, high in watermarks(cluster, spec)] if _exists(cluster, spec) else None
        mirrored = next_offsets(lake, spec).tolist() if lake.exists(spec.name) else None
        print(
            f"  {spec.name}: {spec.partitions} partitions, key {spec.key_format}, "
            f"value {spec.value_format}, partitioner {spec.partitioner}"
            f"{', compacted' if spec.compacted else ''}; Kafka {cluster.topic(spec.name)} "
            + (f"end offsets {ends}" if ends is not None else "(not created yet)")
            + (f"; bronze up to {mirrored}" if mirrored is not None else "; no bronze table yet")
        )
    return 0


def _exists(cluster, spec) -> bool:
    from spark_jobs.kafka import partition_counts

    return cluster.topic(spec.name) in partition_counts(cluster, [cluster.topic(spec.name)])


def cmd_demo(args) -> int:
    from spark_jobs.demo_stories import STORIES

    stories = args.stories or ["consents"]
    for story in stories:
        if story != "consents" and story not in STORIES:
            known = ", ".join(["consents", *STORIES])
            raise UserError(f"unknown demo story '{story}' (known: {known})")
    status = 0
    if "consents" in stories:
        status = _demo_consents(args)
    keyed = [s for s in stories if s != "consents"]
    if keyed and not args.topics_only and status == 0:
        status = _demo_stories(args, [STORIES[s] for s in keyed])
    return status


def _demo_stories(args, stories) -> int:
    """The foreign-key, derive and list joins on small readable data, step by step."""
    from spark_jobs.demo_stories import run_story
    from spark_jobs.ingest import sync_bronze
    from spark_jobs.joins.oracle import audit
    from spark_jobs.joins.runner import run_join
    from spark_jobs.lake import Lake
    from spark_jobs.session import get_spark
    from spark_jobs.show import render, table_rows

    lake = Lake(args.root)
    print(f"lake root: {lake.root}\n(starting Spark for the joins ...)", flush=True)
    spark = get_spark(app_name="demo")

    def run(config, name: str) -> None:
        summary = run_join(spark, lake, config, name, once=True, log=_batch_line)
        if summary.batches == 0:
            print(f"join {name}: nothing new", flush=True)

    def show(name: str, columns: list[str]) -> None:
        _, rows = table_rows(lake, name)
        rows = [{c: _demo_cell(v) for c, v in row.items()} for row in rows]
        for line in render(columns, rows, as_json=False):
            print("  " + line.replace("\t", "  |  "))

    def sync(config, topics: list[str]) -> None:
        sync_bronze(spark, lake, config, topics)

    clean = True
    for story in stories:
        print(f"\n== the {story.name} pipeline ({story.pipeline})", flush=True)
        config = run_story(story, lake, sync, run, show)
        for name in story.show:
            report = audit(spark, lake, config, name)
            print(report.text())
            clean = clean and report.clean
    return 0 if clean else 1


def _batch_line(line: str) -> None:
    if " batch " in line:
        print("  " + line, flush=True)


def _demo_cell(value):
    """A result cell for the demo's tables: an enriched list as `id: fields` items."""
    from spark_jobs.show import shown

    if isinstance(value, list):
        items = []
        for e in value:
            fields = [str(v) for k, v in e.items() if k not in ("id", "matched") and v is not None]
            items.append(f"{e['id']}: {', '.join(fields)}" if e.get("matched") else f"{e['id']}: (unknown)")
        return "[" + "; ".join(items) + "]"
    return "null" if value is None else shown(value)


def _demo_consents(args) -> int:
    """The product's main job on the embedded default: topics -> quality gate (fails: the lookup
    misses old customers) -> backfill -> quality gate (passes)."""
    from spark_jobs import demo
    from spark_jobs.backfill import run_backfill
    from spark_jobs.ingest import run_ingest
    from spark_jobs.kafka import connect
    from spark_jobs.quality import run_suites
    from spark_jobs.session import get_spark
    from spark_jobs.topics import consume

    config, lake = _context(args)
    cluster = connect(config, lake.root)
    print(f"lake root: {lake.root}, Kafka: {cluster.bootstrap_servers} ({cluster.origin})")
    print("\n== 1. topics on Kafka (written with murmur2_random, the Java client's placement)")
    for topic, result in demo.write_demo_topics(cluster, config):
        if result is None:
            print(f"{topic}: already has records, left as it is")
        else:
            placed = ", ".join(f"p{i}={n}" for i, n in enumerate(result.per_partition))
            print(f"{topic}: produced {result.records} records to Kafka topic {result.topic} [{placed}]")
    for topic in (demo.CONSENTS_TOPIC, demo.ACCOUNTS_TOPIC):
        print(f"-- {topic} (key, partition, offset: value), as any Kafka consumer reads it")
        sys.stdout.flush()
        consume(cluster, config.topic(topic), sys.stdout.buffer, fmt="%k\\t%p\\t%o\\t%s\\n")
    if args.topics_only:
        return 0

    print("\n(starting Spark for the ingest, the quality suites and the backfill ...)", flush=True)
    spark = get_spark(app_name="demo")
    print("\n== ingest: Kafka -> bronze Delta tables (Spark Structured Streaming, exactly once)", flush=True)
    print(run_ingest(spark, lake, config).text())

    def check(step: str) -> bool:
        print(f"\n== {step}", flush=True)
        report = run_suites(spark, lake, config, log=lambda m: None)
        for r in report.results:
            print(f"{'PASS' if r.success else 'FAIL'}  {r.check}: {r.description}")
        print(f"report: {report.summary_html}")
        print(f"Data Docs: {report.data_docs}")
        return report.success

    check("2. quality suites before the backfill")
    print("\n== 3. backfill the accounts lookup from the database dump", flush=True)
    summary = run_backfill(spark, lake, config, "accounts", log=lambda m: None)
    print(summary.text())
    passed = check("4. quality suites after the backfill")
    print("\nThe gate " + ("passes: the streaming joins may start." if passed else "still FAILS."))
    if not passed:
        return 1
    return _demo_joins(spark, lake, config)


def _demo_joins(spark, lake, config) -> int:
    """The demo's joins, run after the gate: the table-table join carries every e-mail; the
    stream-table join shows why backfills come first."""
    from spark_jobs import demo
    from spark_jobs.ingest import sync_bronze
    from spark_jobs.joins.oracle import audit
    from spark_jobs.joins.runner import run_join
    from spark_jobs.kafka import connect
    from spark_jobs.show import render, table_rows

    def run(name: str) -> None:
        summary = run_join(spark, lake, config, name, once=True)
        print(summary.text(), flush=True)

    def show(name: str, columns: list[str]) -> None:
        _, rows = table_rows(lake, name)
        rows = [{c: "null" if v is None else v for c, v in row.items()} for row in rows]
        for line in render(columns, rows, as_json=False):
            print("  " + line.replace("\t", "  "))

    print("\n== 5. table-table join consents_with_mail (left join of consents with accounts)", flush=True)
    run(demo.WITH_MAIL)
    show(demo.WITH_MAIL, ["key", "retargeter1", "retargeter2", "contactMailAddress"])
    print("Every consent carries the e-mail, user_9 and user_10 included: a table-table join uses the")
    print("latest value of both sides, so the backfilled accounts completed it.")

    print("\n== 6. stream-table join consents_enriched_at_event_time (as of each event's time)", flush=True)
    run(demo.AT_EVENT_TIME)
    show(demo.AT_EVENT_TIME, ["key", "timestamp", "contactMailAddress"])
    print("user_9 and user_10 have no e-mail: their accounts were backfilled after these consent")
    print("events happened, and a stream-table join never revisits an event. Backfill first, then")
    print("start the stream. A consent event that arrives now, after the backfill, is enriched:")
    if demo.write_late_consent(connect(config, lake.root), config):
        sync_bronze(spark, lake, config, [demo.CONSENTS_TOPIC])
        run(demo.AT_EVENT_TIME)
    show(demo.AT_EVENT_TIME, ["key", "timestamp", "contactMailAddress"])

    print("\n== 7. audit: each result against a batch join of the topics", flush=True)
    clean = True
    for name in (demo.WITH_MAIL, demo.AT_EVENT_TIME):
        report = audit(spark, lake, config, name)
        print(report.text())
        clean = clean and report.clean
    return 0 if clean else 1


def cmd_generate_dump(args) -> int:
    from spark_jobs.demo import write_synthetic_dump

    if args.keys < 1:
        raise UserError("--keys must be at least 1")
    size = write_synthetic_dump(args.out, args.keys, args.prefix)
    print(f"wrote {args.keys:,} lines ({size / 1e6:.1f} MB) to {args.out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and getattr(args, "file", None) == "-" and len(extra) == 1 and not extra[0].startswith("-"):
            args.file = extra[0]  # kcat's order: lake produce TOPIC -K ';' FILE (argparse wants FILE first)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        run: Callable | None = getattr(args, "run", None)
        if run is None:
            parser.print_help()
            return 2
        return run(args)
    except UserError as err:
        print(f"lake: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("lake: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The ``lake`` console script: run, then leave without interpreter teardown.

    Arrow's and delta-rs's native thread pools can abort the process ("terminate called without an
    active exception") when Python tears down modules while one of their workers is still alive,
    after all the work is done (apache/arrow#34314, delta-io/delta-rs#2184). So once the command has
    finished, stop Spark if it was started, flush the streams and exit directly with the command's
    exit code."""
    code = main()
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession() if "pyspark.sql" in sys.modules else None
        if active is not None:
            active.stop()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


if __name__ == "__main__":
    entry()
