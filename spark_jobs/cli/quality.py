"""Data-quality commands: ``check`` (the suites) and ``report`` (the report page)."""

from __future__ import annotations

import json

from spark_jobs.cli.common import SparkProgress, context, registry_first, stderr, write_json
from spark_jobs.errors import UserError, storage_errno


def register(sub, common) -> None:
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

    rep = sub.add_parser(
        "report",
        parents=[common],
        help="write the pipeline's data-quality report page (also written after every quality run)",
    )
    rep.add_argument(
        "--all",
        action="store_true",
        help="every pipeline Airflow shows ($LAKE_PIPELINES, else every bundled one); prints the index "
        "page, which has a section per pipeline",
    )
    rep.set_defaults(run=cmd_report)


def cmd_check(args) -> int:
    from pathlib import Path

    from spark_jobs.quality.gx import preload_great_expectations
    from spark_jobs.quality.run import run_suites
    from spark_jobs.quality.suites import load_suite
    from spark_jobs.seams.session import get_spark

    config, lake = context(args)
    read: list[str] = []
    for name in args.suites or config.quality.suites:  # validate suite files before Spark starts
        if name not in config.quality.suites:
            known = ", ".join(config.quality.suites) or "none"
            raise UserError(f"unknown suite '{name}' in {config.source} (declared: {known})")
        read += load_suite(config.quality.suites[name], config).topics(config)
    registry_first(config, lake, read)
    preload_great_expectations()
    stderr("starting Spark ...")
    spark = get_spark(app_name="quality", root=lake.root)
    try:
        with SparkProgress(spark):
            report = run_suites(
                spark,
                lake,
                config,
                args.suites or None,
                Path(args.report_dir) if args.report_dir else None,
                log=stderr,
            )
    except UserError:
        raise
    except Exception as exc:  # the checks could not run: exit 2, not a pass or a fail
        if storage_errno(exc) is not None or isinstance(exc, OSError):
            raise  # the lake root's storage: the command's own one line (exit 1)
        raise UserError(
            f"could not run the quality suites: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from exc
    if args.summary_json:
        write_json(args.summary_json, report.as_dict())
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for r in report.results:
            print(f"{'PASS' if r.success else 'FAIL'}  {r.suite} / {r.check}: {r.description}")
        print(f"\nchecked: {report.covers()}")
        print(f"summary: {report.summary_html}")
        if report.data_docs:
            print(f"Data Docs: {report.data_docs}")
    return 0 if report.success or args.exit_zero else 1


def cmd_report(args) -> int:
    from spark_jobs.config import load_config, pipeline_files
    from spark_jobs.quality.pages import write_report

    config, lake = context(args)
    if not args.all:
        print(write_report(lake, config))
        return 0
    for path in pipeline_files(args.config):
        write_report(lake, load_config(path))
    print(lake.layout.report_folder.index)
    return 0
