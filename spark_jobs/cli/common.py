"""What every command area shares: the parser class, --root/--config, the pipeline context, and
progress on stderr."""

from __future__ import annotations

import argparse
import json
import sys
import time

from spark_jobs.errors import UserError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other user error
        raise UserError(f"{message} (see '{self.prog} --help')")


def global_options(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--root", default=default, help="lake root directory (default: $LAKE_ROOT or ./lakehouse)"
    )
    parser.add_argument(
        "--config",
        default=default,
        help="pipeline YAML (default: $LAKE_CONFIG or the bundled demo pipeline)",
    )


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def context(args):
    from spark_jobs.config import load_config
    from spark_jobs.seams.delta import Lake

    return load_config(args.config), Lake(args.root)


def registry_first(config, lake, topics=None, reading: bool = True) -> None:
    """Ask the pipeline's Schema Registry once when ``topics`` (default: any of the pipeline's) are
    in a registry format: one line naming it before Spark starts or Kafka is read. ``reading``: the
    command reads the topics, so their subjects' schemas are fetched now too (a subject the registry
    lacks is the same one line, before Spark); a command that may register the first schema says
    False."""
    from spark_jobs.formats import Formats

    Formats(config, lake.root).check(topics, reading)


class Progress:
    """Records/s on stderr while a long call runs (only when stderr is a terminal), out of ``total``
    when it is known."""

    def __init__(self, label: str, total: int | None = None):
        self.label = label
        self.total = total
        self.count = 0
        self.started = time.monotonic()
        self.last = self.started
        self.enabled = sys.stderr.isatty()

    def __call__(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self.last >= 1.0:
            rate = self.count / max(now - self.started, 1e-9)
            of = f" of {self.total:,}" if self.total is not None else ""
            print(f"\r{self.label}: {self.count:,}{of} records ({rate:,.0f}/s)", end="", file=sys.stderr)
            self.last = now

    def done(self) -> None:
        if self.enabled and self.last != self.started:
            print(file=sys.stderr)


def write_json(path: str, data: dict) -> None:
    """Write ``data`` to the file ``path`` names (a local path, or an s3a:// URI: a DAG run's folder
    under a root on object storage), whole or not at all."""
    from spark_jobs.seams.storage import location, write_whole

    write_whole(location(path), json.dumps(data, indent=2))


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
