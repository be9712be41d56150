"""``lake``: the product's command line, one module per area (topics, services, lookups, quality, joins,
lake, demo), each registering its commands.

User mistakes (unknown topic, bad config, bad input line) print one line ``lake: error: …`` and exit
2; nothing is written in that case. A lake root the command cannot write (read-only, not a folder,
full) is one line naming the path, exit 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from spark_jobs import __version__
from spark_jobs.cli import demo, joins, lake, lookups, quality, services, topics
from spark_jobs.cli.common import Parser, global_options
from spark_jobs.errors import FILE_SYSTEM, FULL, UserError, cannot_write, storage_errno

AREAS = (topics, services, lookups, quality, joins, lake, demo)


def build_parser() -> argparse.ArgumentParser:
    # --root/--config are accepted before or after the command; after it they must not reset a value
    # given before it, hence SUPPRESS as the sub-commands' default.
    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    parser = Parser(prog="lake", description="Kafka-style topics and keyed joins kept in a Delta lakehouse.")
    global_options(parser, None)
    parser.add_argument("--version", action="version", version=f"lake {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for area in AREAS:
        area.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = None
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
        with _jvm_output(args):
            return run(args)
    except UserError as err:
        print(f"lake: error: {_told(args, err)}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:  # the reader left (lake show … | head)
        return 0
    except OSError as err:
        if err.errno not in FILE_SYSTEM or (err.filename is None and err.errno not in FULL):
            raise  # not the lake root's file system
        # no filename: a write into an open file (a full disk) under the root
        where = err.filename if err.filename is not None else f"under {_root(args)}"
        print(f"lake: error: {cannot_write(where, err.errno)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lake: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a Spark write the storage refused (full, read-only) is not a bug
        code = storage_errno(err)
        if code is None:
            raise
        print(
            f"lake: error: {cannot_write(f'under {_root(args)} (a Spark write failed)', code)}",
            file=sys.stderr,
        )
        return 1


@contextmanager
def _jvm_output(args: argparse.Namespace) -> Iterator[None]:
    """A Spark JVM the command starts writes its own output to the command's log under the lake
    root (``$LAKE_SPARK_LOG`` when set: a detached job's log), not into the command's output."""
    from spark_jobs.layout import Layout
    from spark_jobs.seams import session
    from spark_jobs.seams.storage import resolve_root

    named = os.environ.get("LAKE_SPARK_LOG")
    log = Path(named) if named else Layout(resolve_root(getattr(args, "root", None))).spark_log(args.command)
    session.send_jvm_output_to(log)
    try:
        yield
    finally:
        session.send_jvm_output_to(None)


def _told(args: argparse.Namespace | None, err: UserError) -> UserError:
    """The error as the user reads it: a registry subject that is missing while the topic holds
    records framed with ids the registry does not know is a registry that lost its schemas, whatever
    command met it (:mod:`spark_jobs.topics.lost_schemas`)."""
    from spark_jobs.formats.registered import MissingSubject

    if not isinstance(err, MissingSubject) or args is None:
        return err
    from spark_jobs.cli.common import context
    from spark_jobs.seams.kafka import connect
    from spark_jobs.topics.lost_schemas import explained

    try:
        config, lake = context(args)
        return explained(config, connect(config, lake.root), err)
    except UserError:
        return err


def _root(args: argparse.Namespace | None) -> str:
    from spark_jobs.seams.storage import resolve_root

    return str(resolve_root(getattr(args, "root", None)))


def entry() -> None:
    """The ``lake`` console script: run, then leave without interpreter teardown.

    Arrow's native thread pools can abort the process ("terminate called without an active
    exception") when Python tears down modules while one of their workers is still alive, after all
    the work is done (apache/arrow#34314). So once the command has
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
