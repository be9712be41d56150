"""The lake's reports served by Airflow's API server: ``/lake-reports/...`` maps to
``<root>/reports/...`` (the quality summary pages and the Great Expectations Data Docs).

Mounted by the Airflow plugin in ``airflow_plugins/lake_reports.py``, so a person reads a failed
gate's report in the browser next to the run, and the UI gets a "Data quality" entry. Read-only
static files under that one folder; the UI of a local ``lake airflow standalone`` has no login, so
neither has this.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from spark_jobs.layout import Layout
from spark_jobs.seams.storage import resolve_root

URL_PREFIX = "/lake-reports"


def reports_dir(root: str | None = None) -> Any:
    """``<root>/reports``: a local folder, or a prefix on an object store."""
    return Layout(resolve_root(root)).reports


def report_url(page: str | None, root: str, base_url: str) -> str | None:
    """The http address of a report page under the lake root (None for pages elsewhere)."""
    if not page:
        return None
    folder = reports_dir(root)
    if isinstance(folder, Path):
        try:
            relative = Path(page).resolve().relative_to(folder.resolve()).as_posix()
        except ValueError:
            return None
    elif page.startswith(f"{folder}/"):
        relative = page[len(f"{folder}/") :]
    else:
        return None
    return f"{base_url.rstrip('/')}{URL_PREFIX}/{relative}"


def create_app(root: str | None = None):
    """Read-only: a GET names a file under ``<root>/reports`` (a folder: its ``index.html``); any
    path that climbs out (``..``) or names nothing is a 404. The same for a local root and one on an
    object store."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import Response

    app = FastAPI(title="Lake reports")

    @app.get("/{path:path}")
    def page(path: str) -> Response:
        parts = [part for part in path.split("/") if part]
        if any(part in (".", "..") or "\\" in part for part in parts):
            raise HTTPException(status_code=404)
        target = reports_dir(root).joinpath(*parts)
        if not parts or not target.is_file():
            target = target / "index.html"
        try:
            data = target.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise HTTPException(status_code=404) from None
        return Response(data, media_type=mimetypes.guess_type(target.name)[0] or "application/octet-stream")

    return app
