"""The lake's reports served by Airflow's API server: ``/lake-reports/...`` maps to
``<root>/reports/...`` (the quality summary pages and the Great Expectations Data Docs).

Mounted by the Airflow plugin in ``airflow_plugins/lake_reports.py``, so a person reads a failed
gate's report in the browser next to the run, and the UI gets a "Data quality" entry. Read-only
static files under that one folder; the UI of a local ``lake airflow standalone`` has no login, so
neither has this.
"""

from __future__ import annotations

from pathlib import Path

from spark_jobs.seams.layout import Layout
from spark_jobs.seams.storage import resolve_root

URL_PREFIX = "/lake-reports"


def reports_dir(root: str | None = None) -> Path:
    return Layout(resolve_root(root)).reports


def report_url(page: str | None, root: str, base_url: str) -> str | None:
    """The http address of a report page under the lake root (None for pages elsewhere)."""
    if not page:
        return None
    try:
        relative = Path(page).resolve().relative_to(reports_dir(root).resolve())
    except ValueError:
        return None
    return f"{base_url.rstrip('/')}{URL_PREFIX}/{relative.as_posix()}"


def create_app(root: str | None = None):
    from fastapi import FastAPI
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="Lake reports")
    # check_dir=False: the folder appears with the first quality run
    app.mount("/", StaticFiles(directory=reports_dir(root), html=True, check_dir=False), name="reports")
    return app
