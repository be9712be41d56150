"""Airflow orchestration: the DAG factory (``dags``), the tasks' runtime code (``tasks``) and the
environment ``lake airflow`` runs Airflow in (``environment``)."""
