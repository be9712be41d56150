"""The Great Expectations adapter: a file-based context under the report directory that validates a
check's findings (``UnexpectedRowsExpectation`` over the rows with a ``problem``, and the check's own
extra expectations) and renders Data Docs once per run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from spark_jobs.seams.storage import copy_tree, remove_tree


@contextmanager
def project_folder(report_dir: Any, staging: Path) -> Iterator[Path]:
    """The local folder of the report directory's Great Expectations project (``gx/``), which GE reads
    and writes as local files: the report directory itself when it is local; for one on an object
    store a copy of its ``gx/`` under ``staging``, copied back when the block ends without an error,
    and removed either way."""
    if isinstance(report_dir, Path):
        yield report_dir
        return
    copy_tree(report_dir / "gx", staging / "gx")
    try:
        yield staging
        copy_tree(staging / "gx", report_dir / "gx")
    finally:
        remove_tree(staging)


def preload_great_expectations() -> None:
    """Import Great Expectations in a background thread: about 6 s of Python (7 CPU-seconds) that a
    quality run would otherwise spend after Spark's start, while starting Spark mostly waits on the
    JVM. Call it before starting Spark; :class:`GreatExpectations` then finds the module loaded (or
    waits for it). A failed import is left for :class:`GreatExpectations` to raise in the main thread."""
    import threading

    def load() -> None:
        try:
            import great_expectations  # noqa: F401
        except Exception:  # noqa: S110 - the main thread's import raises it again, with its traceback
            pass

    threading.Thread(target=load, name="import-gx", daemon=True).start()


class GreatExpectations:
    """A file-based Great Expectations context under the report directory."""

    def __init__(self, report_dir: Path):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.ctx = gx.get_context(mode="file", project_root_dir=str(report_dir))
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.ctx.variables.save()
        # the findings are persisted by us already; GE persisting them again only logs a warning
        self.ds = self.ctx.data_sources.add_or_update_spark(name="lake", persist=False)

    def validate(self, name: str, df: DataFrame, expectations: list) -> list:
        gx = self.gx
        assets = {a.name: a for a in self.ds.assets}
        asset = assets.get(name) or self.ds.add_dataframe_asset(name=name)
        defs = {b.name: b for b in asset.batch_definitions}
        batch_def = defs.get("all") or asset.add_batch_definition_whole_dataframe("all")
        suite = gx.ExpectationSuite(name=name, expectations=expectations)
        suite = self.ctx.suites.add_or_update(suite)
        vd = self.ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=batch_def, suite=suite)
        )
        checkpoint = self.ctx.checkpoints.add_or_update(
            gx.Checkpoint(
                name=name,
                validation_definitions=[vd],
                actions=[],  # Data Docs are built once per run (docs_index), not per check
                result_format={"result_format": "SUMMARY"},
            )
        )
        result = checkpoint.run(batch_parameters={"dataframe": df})
        return [r for vr in result.run_results.values() for r in vr.results]

    def docs_index(self) -> str | None:
        """Build the Data Docs of the run's validations (once: each build renders the whole site)
        and return the site's index."""
        self.ctx.build_data_docs()
        sites = self.ctx.get_docs_sites_urls()
        return sites[0]["site_url"] if sites else None


def unexpected_rows(query_cols: str, description: str):
    import great_expectations as gx

    return gx.expectations.UnexpectedRowsExpectation(
        unexpected_rows_query=f"SELECT {query_cols} FROM {{batch}} WHERE problem IS NOT NULL",
        description=description[:4000],
    )


def outcome(results: list) -> tuple[bool, str]:
    ok = all(r.success for r in results)
    observed = ", ".join(
        str(r.result.get("observed_value", r.result.get("unexpected_count", ""))) for r in results
    )
    return ok, observed
