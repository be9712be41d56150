"""Lake commands: ``show`` (a table), ``quarantine``, ``sql`` and ``dbt`` (the catalog and marts),
``airflow``."""

from __future__ import annotations

import argparse

from spark_jobs.cli.common import stderr
from spark_jobs.errors import UserError


def register(sub, common) -> None:
    sh = sub.add_parser(
        "show",
        parents=[common],
        help="print a table's current rows sorted by key (a join's current view <join>__current too), "
        "or with --changes its change feed",
    )
    sh.add_argument("table")
    sh.add_argument("--changes", action="store_true", help="the change feed in commit order")
    sh.add_argument("--json", action="store_true", help="one JSON object per line")
    sh.set_defaults(run=cmd_show)

    qu = sub.add_parser(
        "quarantine",
        parents=[common],
        help="the records the pipeline's joins and backfills did not use: counts by reason, then the rows",
        description="Every record a join does not use (undecodable, a null key, a null foreign or derived "
        "key, no list, a stream's tombstone, a record its select fails on) and every dump line a backfill "
        "could not read is in "
        "the quarantine table. This counts the pipeline's by job and reason, then lists them, newest first. "
        "--replay puts the ones a fix can mend (undecodable once the format or schema is fixed, poison once "
        "the select is) back on their topic as they were, once each (docs/operating.md).",
    )
    qu.add_argument("--join", help="only this join's")
    qu.add_argument("--reason", help="only this reason's (e.g. undecodable, null_key, poison)")
    qu.add_argument("--limit", type=int, default=20, help="rows to list (default 20; 0: only the counts)")
    qu.add_argument("--json", action="store_true", help="one JSON object per row (all of them)")
    qu.add_argument(
        "--replay",
        action="store_true",
        help="produce the records a fix can mend back to their topic (with --join / --reason: those only)",
    )
    qu.add_argument(
        "--dry-run", action="store_true", help="with --replay: say what it would replay, send nothing"
    )
    qu.set_defaults(run=cmd_quarantine)

    db = sub.add_parser(
        "dbt",
        parents=[common],
        help="run dbt on the lake (dbt-spark, session mode): e.g. 'lake dbt build'",
        description="Runs dbt with the project in dbt/ in a Spark session that sees the lake's tables as "
        "lake.<table> (catalog tables over the lake root); the marts are tables marts.<name> "
        "under <root>/warehouse.",
    )
    db.add_argument("dbt_args", nargs=argparse.REMAINDER, help="dbt's command and options")
    db.set_defaults(run=cmd_dbt)

    sq = sub.add_parser(
        "sql",
        parents=[common],
        help="run Spark SQL queries over the marts (marts.<name>) and the lake (lake.<table>)",
        description="Runs each query in turn in one Spark session (one start for all of them) and prints "
        "each result, a header line and tab-separated rows (with --json one object per row), the "
        "results separated by an empty line. A failing query prints nothing and names which it was.",
    )
    sq.add_argument("query", nargs="+")
    sq.add_argument("--json", action="store_true", help="one JSON object per line")
    sq.set_defaults(run=cmd_sql)

    af = sub.add_parser(
        "airflow",
        parents=[common],
        help="run an airflow command with this repo's DAGs, lake root and Spark master (see docs/airflow.md)",
        description="Runs 'airflow ARGS' with AIRFLOW_HOME (default ./.airflow, or $LAKE_AIRFLOW_HOME), "
        "the dags/ folder, no example DAGs, the lake root and the Spark connection configured. "
        "Example: lake airflow standalone",
    )
    af.add_argument("airflow_args", nargs=argparse.REMAINDER, metavar="ARGS")
    af.set_defaults(run=cmd_airflow)


def cmd_show(args) -> int:
    from spark_jobs.seams.delta import Lake
    from spark_jobs.show import render, table_rows

    lake = Lake(args.root, quick=True, log=stderr)  # on the Spark Connect server when it runs (lake up)
    columns, rows = table_rows(lake, args.table, changes=args.changes)
    rows = _decoded(args, lake, rows)
    for line in render(columns, rows, args.json):
        print(line)
    return 0


def cmd_quarantine(args) -> int:
    from spark_jobs.config import load_config
    from spark_jobs.quarantine import check_cause, quarantined, row_line
    from spark_jobs.seams.delta import Lake
    from spark_jobs.show import render

    check_cause(args.reason)
    if args.limit < 0:
        raise UserError("--limit: a number of rows, 0 or more")
    if args.dry_run and not args.replay:
        raise UserError("--dry-run goes with --replay")
    config = load_config(args.config)
    if args.replay:  # the topics' codecs decide what decodes now: a local session, as the joins have
        from spark_jobs.quarantine import replay

        lake = Lake(args.root, log=stderr)
        for line in replay(
            lake, config, quarantined(lake, config, args.join, args.reason), args.dry_run, stderr
        ).lines():
            print(line)
        return 0
    lake = Lake(args.root, quick=True, log=stderr)  # on the Spark Connect server when it runs (lake up)
    found = quarantined(lake, config, args.join, args.reason)
    if args.json:
        for line in render(list(found.rows[0]) if found.rows else [], found.rows, True):
            print(line)
        return 0
    print(f"{found.covers()}: {len(found.rows)} record(s)")
    for (job, cause), n in sorted(found.counts().items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
        print(f"  {job}: {cause} {n}")
    for row in found.rows[: args.limit]:
        print(row_line(row))
    if len(found.rows) > args.limit > 0:
        print(f"... {len(found.rows) - args.limit} more (--limit, or --json for all)")
    return 0


def _decoded(args, lake, rows: list[dict]) -> list[dict]:
    """A Schema Registry topic's mirror (bronze, or a lookup's table) with its keys and values
    decoded as its pipeline declares them (a record that does not decode is shown as its bytes)."""
    from spark_jobs.config import load_config
    from spark_jobs.formats import DecodeError, Formats
    from spark_jobs.layout import lookup_table

    config = load_config(args.config)
    lookups = {lookup_table(name): spec.topic for name, spec in config.lookups.items()}
    topic = args.table if args.table in config.topics else lookups.get(args.table)
    if topic is None or not config.topic(topic).registered:
        return rows
    formats = Formats(config, lake.root)
    codecs = [(part, formats.codec(topic, part)) for part in ("key", "value")]
    out = []
    for row in rows:
        row = dict(row)
        for part, codec in codecs:
            if codec.registered and isinstance(row.get(part), bytes):
                try:
                    row[part] = codec.decode(row[part])
                except DecodeError:
                    pass  # shown as it is
        out.append(row)
    return out


def cmd_dbt(args) -> int:
    from spark_jobs.seams.delta import Lake
    from spark_jobs.seams.marts import run_dbt

    return run_dbt(Lake(args.root), args.dbt_args, log=stderr)


def cmd_sql(args) -> int:
    from spark_jobs.seams.delta import Lake
    from spark_jobs.seams.marts import query
    from spark_jobs.show import render

    answers = query(Lake(args.root), args.query, log=stderr)
    for n, (columns, rows) in enumerate(answers):
        if n:
            print()
        for line in render(columns, rows, args.json):
            print(line)
    return 0


def cmd_airflow(args) -> int:
    from spark_jobs.orchestration.environment import run_airflow

    return run_airflow(args.airflow_args, root=args.root, config=args.config)
