"""Lookup commands: ``backfill`` (a dump into a lookup's topic) and ``generate-dump`` (benchmark dumps)."""

from __future__ import annotations

import json
import sys

from spark_jobs.cli.common import SparkProgress, context, registry_first, stderr, write_json
from spark_jobs.config import PARTITIONERS
from spark_jobs.errors import UserError


def register(sub, common) -> None:
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
    b.add_argument(
        "--missing-only",
        action="store_true",
        help="write only keys the topic lacks; keys it holds with another value are counted, not "
        "overwritten (what the scheduled pipeline run does: the topic may be newer than the dump)",
    )
    b.add_argument("--max-rejects", type=int, default=0, metavar="N", help="fail above N bad lines")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON to FILE")
    b.set_defaults(run=cmd_backfill)

    g = sub.add_parser(
        "generate-dump",
        parents=[common],
        help="write a large synthetic key;value dump (for benchmarks)",
    )
    g.add_argument("out")
    g.add_argument("--keys", type=int, required=True)
    g.add_argument("--prefix", default="user_")
    g.set_defaults(run=cmd_generate_dump)


def cmd_backfill(args) -> int:

    from spark_jobs.lookups.backfill import run_backfill
    from spark_jobs.seams.session import get_spark

    config, lake = context(args)
    lookup = config.lookup(args.lookup)  # fail fast, before Spark starts
    if args.max_rejects < 0:
        raise UserError("--max-rejects must not be negative")
    if args.source:
        from spark_jobs.lookups.dumps import dump_source

        args.source = dump_source(args.source)

    registry_first(config, lake, [lookup.topic], reading=False)  # its first schema may come from the dump's
    stderr("starting Spark ...")
    spark = get_spark(app_name=f"backfill-{args.lookup}", root=lake.root)
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
            missing_only=args.missing_only,
            log=stderr,
        )
    print(json.dumps(summary.as_dict()) if args.json else summary.text())
    if args.summary_json:
        write_json(args.summary_json, summary.as_dict())
    return 0


def cmd_generate_dump(args) -> int:
    from spark_jobs.demo.data import write_synthetic_dump

    if args.keys < 1:
        raise UserError("--keys must be at least 1")
    size = write_synthetic_dump(args.out, args.keys, args.prefix)
    print(f"wrote {args.keys:,} lines ({size / 1e6:.1f} MB) to {args.out}", file=sys.stderr)
    return 0
