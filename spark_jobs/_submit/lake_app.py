"""The application file Airflow's SparkSubmitOperator submits: ``spark-submit lake_app.py ARGS`` runs
``lake ARGS`` inside the driver spark-submit started (so the connection's master applies).

It sits alone in its folder because Python puts a script's folder first on ``sys.path``.
"""

from spark_jobs.cli import entry

if __name__ == "__main__":
    entry()
