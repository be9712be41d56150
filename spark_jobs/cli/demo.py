"""``lake demo``: the demo stories, told step by step on the console."""

from __future__ import annotations

from spark_jobs.cli.common import context


def register(sub, common) -> None:
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


def cmd_demo(args) -> int:
    from spark_jobs.demo.console import tell

    config, lake = context(args)
    return tell(args.stories, config, lake, topics_only=args.topics_only)
