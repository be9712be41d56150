"""``python -m spark_jobs.cli``: the ``lake`` command."""

from spark_jobs.cli import entry

entry()
