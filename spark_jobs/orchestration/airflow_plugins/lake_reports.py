"""Airflow plugin (this folder is Airflow's plugins folder under ``lake airflow``): serves the lake's
quality reports at /lake-reports and adds "Data quality" to the UI's navigation."""

from airflow.plugins_manager import AirflowPlugin

from spark_jobs.orchestration.reports import URL_PREFIX, create_app


class LakeReportsPlugin(AirflowPlugin):
    name = "lake_reports"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Lake reports"}]
    external_views = [
        {
            "name": "Data quality",
            "href": f"{URL_PREFIX}/quality/index.html",  # the pipelines' report pages
            "destination": "nav",
            "url_route": "data-quality",
        }
    ]
