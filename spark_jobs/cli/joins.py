"""Join commands: ``run``, ``start`` / ``stop`` (detached jobs), ``status``, ``health``, ``audit``,
``explain``."""

from __future__ import annotations

import json

from spark_jobs.cli.common import context, registry_first, stderr
from spark_jobs.errors import UserError


def register(sub, common) -> None:
    r = sub.add_parser(
        "run",
        parents=[common],
        help="run a join: --once (everything available, then exit) or --continuous (until stopped)",
        description="Runs a join of the pipeline as a Spark Structured Streaming query over its Kafka "
        "topics. It resumes where it stopped (checkpoint under <root>/_checkpoints/JOIN: Kafka offsets). "
        "--once reads the topics up to their end offsets as it starts and says which offsets it read; "
        "--continuous stops after the current micro-batch on SIGTERM or Ctrl-C.",
    )
    r.add_argument("join")
    mode = r.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="process everything available, then exit")
    mode.add_argument("--continuous", action="store_true", help="run until SIGTERM / Ctrl-C")
    r.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS", help="micro-batch interval")
    r.add_argument(
        "--max-records", type=int, metavar="N", help="at most N Kafka offsets per micro-batch (all inputs)"
    )
    r.add_argument(
        "--table-every",
        type=float,
        metavar="SECONDS",
        help="a keyed join with --continuous: publish every micro-batch, write the result table behind "
        "it at most every SECONDS (default: the join's table_every setting, else every micro-batch)",
    )
    r.add_argument("--reset", action="store_true", help="forget the join's state and result first")
    r.set_defaults(run=cmd_run)

    sj = sub.add_parser(
        "start",
        parents=[common],
        help="start a join's continuous job as a detached process (nothing happens if it runs)",
    )
    sj.add_argument("join")
    sj.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS", help="micro-batch interval")
    sj.add_argument("--table-every", type=float, metavar="SECONDS", help="as for lake run --continuous")
    sj.set_defaults(run=cmd_start)

    sp = sub.add_parser("stop", parents=[common], help="stop a join's continuous job after its current batch")
    sp.add_argument("join")
    sp.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="how long to wait")
    sp.set_defaults(run=cmd_stop)

    st = sub.add_parser(
        "status",
        parents=[common],
        help="the joins: running?, last batch, Kafka records behind, result rows not yet in the table",
    )
    st.add_argument("--json", action="store_true", help="one JSON object per join")
    st.set_defaults(run=cmd_status)

    he = sub.add_parser(
        "health",
        parents=[common],
        help="exit 1 (and say why) when a join's job is down, stuck, or too far behind its inputs",
    )
    he.add_argument("joins", nargs="*", metavar="JOIN", help="default: every join of the pipeline")
    he.add_argument(
        "--max-behind", type=int, metavar="N", help="records (default: airflow.max_records_behind)"
    )
    he.set_defaults(run=cmd_health)

    au = sub.add_parser(
        "audit",
        parents=[common],
        help="compare a join's result with a batch join of its topics (exit 1 when they differ)",
    )
    au.add_argument("join")
    au.add_argument("--json", action="store_true", help="print the report as JSON")
    au.set_defaults(run=cmd_audit)

    ex = sub.add_parser(
        "explain",
        parents=[common],
        help="why a join's result for a key is what it is: the input records, why a side is empty, "
        "the row's history, the quality gate's view",
        description="Shows the join's current row for KEY with the Kafka records it was computed from "
        "(each marked when it is in another partition than its key belongs in); for a side without a "
        "record, why (found on Kafka as the topic is now); the row's changes, newest first; and the last "
        "quality runs that named the key. Runs on the Spark Connect server when it runs (lake up).",
    )
    ex.add_argument("join")
    ex.add_argument("key", help="the key as text (see --key-hex)")
    ex.add_argument("--key-hex", action="store_true", help="KEY is the key's bytes in hex")
    ex.add_argument("--limit", type=int, default=10, metavar="N", help="at most N rows and changes")
    ex.add_argument("--json", action="store_true", help="print the explanation as JSON")
    ex.set_defaults(run=cmd_explain)


def cmd_run(args) -> int:
    from spark_jobs.joins.runner import check_table_every, reset_join, run_join
    from spark_jobs.runtime.profile import watch_queries
    from spark_jobs.seams.session import get_spark

    config, lake = context(args)
    spec = config.join(args.join)  # fail fast, before Spark starts
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    if args.max_records is not None and args.max_records < 1:
        raise UserError("--max-records must be at least 1")
    check_table_every(spec, args.once, args.table_every)
    registry_first(config, lake, [topic for _, topic in spec.sides])
    if args.reset:
        for item in reset_join(lake, config, args.join):
            stderr(f"reset: removed {item}")
    stderr("starting Spark ...")
    spark = get_spark(app_name=f"join-{args.join}", root=lake.root)
    watch_queries(spark, stderr)
    summary = run_join(
        spark,
        lake,
        config,
        args.join,
        once=args.once,
        trigger_seconds=args.trigger,
        max_records=args.max_records,
        log=stderr,
        table_every=args.table_every,
    )
    print(summary.text())
    return 0


def cmd_start(args) -> int:
    from spark_jobs.config import resolve_config_path
    from spark_jobs.joins.runner import check_table_every
    from spark_jobs.joins.supervise import launch_ingest, launch_join, start_jobs

    config, lake = context(args)
    spec = config.join(args.join)
    if args.trigger <= 0:
        raise UserError("--trigger must be a positive number of seconds")
    check_table_every(spec, once=False, table_every=args.table_every)
    config_path = str(resolve_config_path(args.config).resolve())
    # the pipeline's mirror beside the join (the lake's tables keep up), both drivers starting at once
    ingest, state = start_jobs(
        [
            launch_ingest(lake, config_path, config),
            launch_join(lake, config_path, spec, args.trigger, table_every=args.table_every),
        ]
    )
    if ingest.changed:
        print(f"{ingest.label}: started (pid {ingest.pid}); log: {ingest.log}")
    verb = "started" if state.changed else "already running"
    print(f"{state.label}: {verb} (pid {state.pid}); log: {state.log}")
    return 0


def cmd_stop(args) -> int:
    from spark_jobs.joins.supervise import stop_join

    config, lake = context(args)
    state = stop_join(lake, config.join(args.join), args.timeout)
    print(f"{state.label}: " + (f"stopped (pid {state.pid})" if state.changed else "was not running"))
    return 0


def cmd_status(args) -> int:
    from dataclasses import asdict

    from spark_jobs.joins.runner import status
    from spark_jobs.joins.supervise import ingest_status
    from spark_jobs.topics.lookup_tables import lookup_lags

    config, lake = context(args)
    rows = status(lake, config)
    ingest = ingest_status(lake, config)
    lags, lag_error = lookup_lags(lake, config)
    if args.json:
        print(json.dumps({**ingest, "lookups": [asdict(lag) for lag in lags]}))
        for row in rows:
            print(json.dumps(row))
        return 0
    state = (
        f"running (pid {ingest['pid']}, heartbeat {ingest['heartbeat_at']}"
        + (f"; metrics {ingest['metrics_url']})" if ingest["metrics_url"] else ")")
        if ingest["running"]
        else "stopped"
    )
    print(f"bronze mirror ({ingest['job']}): {state}")
    for lag in lags:
        print(lag.text() + (f" (records behind unknown: {lag_error})" if lag_error else ""))
    if not rows:
        print(f"no joins declared in {config.source}")
    if rows and rows[0]["kafka_error"]:
        print(f"records behind: unknown ({rows[0]['kafka_error']})")
    for row in rows:
        print(status_line(config, row))
    return 0


def status_line(config, row: dict) -> str:
    """One join's line: ``t_left (table): stopped; records behind: L 0, R 2; read L up to offsets [..],
    ...; result table 0 rows behind its changelog; last batch ...``."""
    from spark_jobs.joins.runner import dropped_text, offsets_read

    spec = config.join(row["join"])
    state = f"running (pid {row['pid']})" if row["running"] else "stopped"
    if row["running"] and row.get("metrics_url"):
        state = f"running (pid {row['pid']}; metrics {row['metrics_url']})"
    behind = ", ".join(
        f"{topic} {'-' if row['records_behind'][side] is None else row['records_behind'][side]}"
        for side, topic in spec.sides
    )
    parts = [f"{row['join']} ({row['kind']}): {state}", f"records behind: {behind}"]
    if row["checkpoint_error"]:
        parts.append(row["checkpoint_error"])
    elif row["offsets"]:
        parts.append(f"read {offsets_read(spec, config, row['offsets'])}")
    else:
        parts.append("nothing read yet")
    if row.get("waiting"):
        parts.append(row["waiting"])
    if row.get("dropped"):
        since = "since it started" if row["running"] else "in its last run"
        parts.append(f"dropped {since} (in the quarantine): {dropped_text(row['dropped'])}")
    if row.get("first_batch"):
        first = row["first_batch"]
        parts.append(
            f"first batch {first['after_s']:g} s after {'its' if row['running'] else 'the last run'}'s start "
            f"({first['after_spark_s']:g} s after Spark was ready)"
        )
    if spec.publish and row["table_behind"]:
        parts.append(f"result table {row['table_behind']} row(s) behind its changelog topic")
    parts.append(
        f"last batch {row['last_batch_at']}: {row['last_batch_in']} in, {row['last_batch_out']} out, "
        f"{row['last_batch_ms']} ms, {row['pending']} pending"
        + (f", {row['skipped']} skipped (null key)" if row.get("skipped") else "")
        if row["last_batch_at"]
        else "no batch yet"
    )
    return "; ".join(parts)


def cmd_health(args) -> int:
    from spark_jobs.joins.supervise import health

    config, lake = context(args)
    for name in args.joins:
        config.join(name)
    limit = config.airflow.max_records_behind if args.max_behind is None else args.max_behind
    if limit < 0:
        raise UserError("--max-behind must not be negative")
    problems = health(lake, config, limit, args.joins or None)
    for problem in problems:
        print(f"UNHEALTHY: {problem}")
    if not problems:
        print(
            f"healthy: {', '.join(args.joins or config.joins) or 'no joins'} (limit {limit} records behind)"
        )
    return 1 if problems else 0


def cmd_explain(args) -> int:
    from spark_jobs.config import load_config
    from spark_jobs.joins.explain import explain
    from spark_jobs.seams.delta import Lake

    config = load_config(args.config)
    config.join(args.join)  # fail fast, before Spark starts
    if args.key_hex:
        try:
            key = bytes.fromhex(args.key)
        except ValueError:
            raise UserError(f"--key-hex: '{args.key}' is not hex (e.g. 757365725f39 for user_9)") from None
    else:
        key = args.key.encode("utf-8")
    lake = Lake(args.root, quick=True, log=stderr)  # on the Spark Connect server when it runs (lake up)
    registry_first(config, lake, [topic for _, topic in config.join(args.join).sides])
    found = explain(lake, config, args.join, key, args.limit)
    print(json.dumps(found.as_dict(), default=str) if args.json else found.text())
    return 0


def cmd_audit(args) -> int:

    from spark_jobs.joins.oracle import SAMPLE, audit
    from spark_jobs.seams.session import get_spark

    config, lake = context(args)
    spec = config.join(args.join)
    if not lake.exists(args.join):
        raise UserError(f"join {args.join} has no result yet: run 'lake run {args.join} --once' first")
    registry_first(config, lake, [topic for _, topic in spec.sides])
    stderr("starting Spark ...")
    report = audit(get_spark(app_name=f"audit-{args.join}", root=lake.root), lake, config, args.join)
    if args.json:
        print(
            json.dumps(
                {
                    "join": report.join,
                    "clean": report.clean,
                    "expected_rows": report.expected_rows,
                    "actual_rows": report.actual_rows,
                    "differing_keys": [k.decode("utf-8", "backslashreplace") for k in report.differing_keys],
                    "not_compared_keys": [k.decode("utf-8", "backslashreplace") for k in report.left_out],
                    "unordered_keys": [k.decode("utf-8", "backslashreplace") for k in report.unordered],
                    "unordered_columns": list(report.unordered_columns),
                    "read": report.read,
                }
            )
        )
    else:
        print(report.text())
        for label, rows in (("missing", report.missing), ("unexpected", report.unexpected)):
            for row in rows[:SAMPLE]:
                print(f"  {label}: {row}")
    return 0 if report.clean else 1
